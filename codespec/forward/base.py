"""The one door to a model's passes: the `Forward` protocol every backend implements.

The engine (engine/) never touches a model: it asks a `Forward` to prefill a prompt
chunk into a KV slot and to run verify passes, and reads logits or greedy choices back.
Each way of computing a pass is one backend in this folder, chosen once at start-up
(select.py says which and why):

    backend        module            where
    rowdecoder     rows.py           C row decoder (kernels/rowdecoder.c): CPUs with AVX-512 BF16,
                                     Qwen2/Llama in bfloat16; weights straight from safetensors
                                     (no torch import) or from a transformers model
    transformers   transformers.py   transformers' forward with row-exact attention and row-blocked
                                     linear layers, probed per machine: every other CPU and model
    cuda           cuda/forward.py   fixed-shape passes in CUDA graphs: Qwen2/Llama on NVIDIA GPUs

Vocabulary. A pass runs *rows* over KV slots: `requests` lists each request's part as
(slot, start, tree), where `start` is the slot's length before the pass and `tree` is
its VerifyTree (node 0 the pending token, nodes 1.. the draft; verify/tree.py). Node i
is written to the slot at start + i and sits at rotary position start + depth(i); it
sees the slot's first `start` keys, then its ancestors and itself. Logits are [rows,
vocab] in the backend's own form (numpy bf16 bits, or a torch tensor): the verifier only
slices them and hands them back to `argmax` or `tensor`.

Exactness contract. Row i of a pass must equal, bit for bit, the decode step it stands
for: the same token at the same position after the same keys, computed as a one-row
pass. That makes greedy speculation lossless whatever the draft or the batch. A prefill
needs only to be deterministic per pass, in the passes `cache.spans` gives (whole chunks
on the absolute grid, the last chunk in sub-chunks), so a reused prompt prefix and a
fresh prefill give the same KV. Every backend keeps the contract (`exact`): an additive
tree mask per request (fewer, larger attention calls) keeps it only up to rounding, so
none attends that way.

    forward.prefill(cache, slot, prompt, start=0)   # -> logits [1, vocab] after the prompt
    forward.choices(cache, [(slot, start, tree)])   # -> greedy choice per row (list[int])
    forward.keep(cache, [(slot, start, path)])      # accepted nodes' KV moved after the context

Optional capabilities, declared on the class with their defaults: an `asynchronous`
backend's `launch(cache, requests)` queues the pass and returns what waits for its
choices (forward/cuda/forward.py), so the engine drafts ahead meanwhile (engine/ahead.py); one
that `chains_steps` takes `launch(..., chain_next=True)` where every request's next pass
is a plain greedy step, and queues it behind this one (forward/cuda/chained.py); `max_tail` caps
a row's off-chain path.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

# (slot, slot length before the pass, tree) per request of a pass, in packing order
Requests = Sequence[tuple[int, int, Any]]
# (slot, slot length before the pass, accepted nodes) per request whose path left the main chain
Moves = Sequence[tuple[int, int, Sequence[int]]]


class Preempted(Exception):
    """A background prefill gave way to a request (`SlotCache.preempted` said so between
    two layers); the pass it was computing is dropped, the passes before it stay."""


class Forward:
    """A model's prefill and verify passes over `SlotCache` KV slots (module docstring).
    Every backend subclasses it; the optional capabilities have their defaults here."""

    name: str  # the backend: "rowdecoder", "cuda" or "transformers"
    config: Any  # the model's config (layers, heads, vocab_size, max_position_embeddings, ...)
    generation_config: Any  # its generation config (eos_token_id)
    kv_dtype: Any  # the KV slots' element type: a torch dtype, or numpy.uint16 (bf16 bits)
    device: Any  # where the KV slots and logits live
    exact = True  # rows equal decode steps bit for bit (the exactness contract): every backend
    min_rows: int  # the fewest rows a pass computes (a lone row is padded to this many)
    # A prefill computes each position as a decode step would, so a position's KV depends
    # on the tokens up to it alone, not on the passes: any cached prefix is reusable
    # (kvcache.py).
    prefill_exact: bool = False
    # The most nodes a row's path may hold off its tree's main chain (Draft.within_tail):
    # the engine cuts deeper branches from drafts first. None: no limit.
    max_tail: int | None = None
    # `launch` returns before the pass ends (a GPU's): the engine drafts ahead meanwhile.
    asynchronous: bool = False
    # `launch(..., chain_next=True)` queues the next plain greedy step behind the pass.
    chains_steps: bool = False
    # The first pass over a KV cache costs seconds (compilation, a graph's capture): the
    # engine runs one at start-up.
    warm_up_pass: bool = False

    def probe(self, stored: tuple[int, bool] | None) -> tuple[int, bool]:
        """(row block, padded attention): what keeps passes row-exact on this machine, adopted
        from `stored` (the machine profile) or measured now; (0, False) where nothing needs it."""
        ...

    def profile_key(self) -> dict[str, str]:
        """Everything the machine profile of this backend was measured under (profile.py)."""
        ...

    def prefill(self, cache: Any, slot: int, prompt: Sequence[int], start: int) -> Any:
        """Write the KV of prompt[start:] into `slot` in the passes `cache.spans` gives; the
        logits after the last token: [1, vocab]. `start` is a boundary of those passes."""
        ...

    def logits(self, cache: Any, requests: Requests) -> Any:
        """Run one pass over every request's tree, writing each row's KV; [rows, vocab]."""
        ...

    def choices(self, cache: Any, requests: Requests) -> list[int]:
        """The same pass, returning only each row's greedy choice (the first maximum of its
        logits, as torch.argmax): what an all-greedy pass needs."""
        ...

    def launch(self, cache: Any, requests: Requests, chain_next: bool = False) -> Callable[[], list[int]]:
        """`choices`' pass queued; returns what waits for its choices. Synchronous backends
        compute it now."""
        choices = self.choices(cache, requests)
        return lambda: choices

    def argmax(self, logits: Any) -> list[int]:
        """Each row's first maximum."""
        ...

    def tensor(self, logits: Any) -> Any:
        """The logits as a torch tensor [rows, vocab] (sampling rules take tensors)."""
        ...

    def keep(self, cache: Any, moves: Moves) -> None:
        """Move each request's accepted nodes' KV to follow its context: node 0 stays at
        start, path[j] goes to start + 1 + j."""
        ...


def kv_dims(config: Any) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a transformers decoder config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv_heads, head_dim


def max_context(config: Any) -> int:
    """The model's context length (unbounded when the config does not say)."""
    return int(getattr(config, "max_position_embeddings", 0) or 1 << 30)


def eos_ids(generation_config: Any, tokenizer: Any = None) -> set[int]:
    """The end-of-sequence ids of a generation config and a tokenizer."""
    ids: set[int] = set()
    configured = getattr(generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(t) for t in configured)
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
