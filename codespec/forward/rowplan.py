"""The layout arithmetic of row-exact attention calls, without torch: key padding, query
slots per token. rowcalls.py builds the calls from it; the KV cache and the verifier (the
keys a padded call reads, which the cost model is given) use it too, in processes that
never import torch (the torch-free load, direct.py).
"""

from __future__ import annotations

KEY_BLOCK = 512  # keys per block of torch's CPU flash attention loop (kv_split_size)
Q_BLOCK = 32  # query rows per block of that loop while a call has fewer than ...
Q_SPLIT_LIMIT = 192  # ... this many query rows (from 192 on the kernel takes 64-row blocks)


def padded_length(keys: int) -> int:
    """Keys a padded call attends to when its longest row sees `keys`: whole key blocks.

    >>> [padded_length(n) for n in (1, 512, 513, 1200)]
    [512, 512, 1024, 1536]
    """
    return max(KEY_BLOCK, -(-keys // KEY_BLOCK) * KEY_BLOCK)


def head_slots(group: int) -> int:
    """Query rows one token takes in a padded call: `group` (query heads per KV head)
    rounded up to a power of two, or to whole query blocks past one block.

    >>> [head_slots(g) for g in (1, 2, 4, 7, 8, 12, 32, 40)]
    [1, 2, 4, 8, 8, 16, 32, 64]
    """
    if group > Q_BLOCK:
        return -(-group // Q_BLOCK) * Q_BLOCK
    return 1 << (group - 1).bit_length()


def tokens_per_element(group: int) -> int:
    """Most tokens one batch element of a padded call holds (its query rows stay below
    the kernel's limit for `Q_BLOCK`-row query blocks).

    >>> tokens_per_element(7), tokens_per_element(2), tokens_per_element(64)
    (23, 95, 2)
    """
    return max(1, (Q_SPLIT_LIMIT - 1) // head_slots(group))
