"""Draft policy: what to propose and how much of it to verify.

    proposer.py    drafts from the request's context, the suffix index and copy anchors
    controller.py  the goodput controller: each request's draft budget and source
    fastchoice.py  the controller's choice for a whole batch in one numba call
"""
