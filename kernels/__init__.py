"""Triton kernels, each beside a plain-torch reference of the same op.

The kernels arrive with the verifier issue; CPU serving uses the torch references.
"""
