"""The verifier: draft trees as a pass's rows and what a pass accepts of them.

    tree.py       VerifyTree (a request's pending token and draft, depth first), greedy
                  acceptance (`accept_choices`)
    sampling.py   sampled acceptance: lossless speculative sampling (imports torch)
    logprobs.py   acceptance that also reports each committed token's logprobs
    verifier.py   the verify pass over the KV slots: run, accept, compact, commit
"""
