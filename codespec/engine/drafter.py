"""A draft model: a smaller model of the same tokenizer writes drafts where nothing matches.

Suffix drafts copy; where the request's context and the index hold nothing to copy
(a fill-in-the-middle completion of fresh code), the classic draft model guesses: the
0.5B greedily writes k tokens, and the large model verifies them in one pass, as
transformers' assisted generation and llama.cpp's `--model-draft` do. The verifier is
the same, so output stays the large model's token for token.

The draft model keeps its own KV slots (a SlotCache of its shapes). It reads a window
of the request's prompt, not all of it (`window`): its prefill is time the request
waits, and ~300 tokens of a fill-in-the-middle prompt (the prefix's tail, the suffix's
head) kept its agreement with the 1.5B where the whole prompt had it on 3 of 4 functions
of the repository bench (0.5B for 1.5B, 2026-12-08: 72-79 of 96 tokens either way; the
one it lost was a copy, which suffix drafts take). After each verify pass its slot is
cut back to what both models committed and the rest is computed in the first draft step.

The engine decides, per request and pass, whether the draft model runs and for how many
tokens (`tokens_to_draft`, asked by engine.py `_with_model_drafts`): the goodput controller prices its steps (`step_s`,
measured) beside the verify pass, and its first prefill against the output still to come.

    drafter = Drafter(small.forward, fim_ids=fim_token_ids(tokenizer))
    drafts = drafter.draft([(run, 4)])   # Draft chains, source "model"
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

from codespec.engine.kvcache import CacheFull, SlotCache
from codespec.forward.base import Forward, max_context
from codespec.index import Draft
from codespec.policy import controller
from codespec.prompts import grid_start
from codespec.policy.controller import MODEL_SOURCE
from codespec.verify.tree import Item, VerifyTree
from codespec.verify.verifier import Verifier

log = logging.getLogger(__name__)
WINDOW_TOKENS = 160  # the prompt tokens the draft model reads (Settings.draft_model_window)
SUFFIX_SHARE = 5  # of a fill-in-the-middle window, 1/SUFFIX_SHARE goes to the suffix's head
SLOTS = 4  # requests drafted for at once; more wait for a slot (and draft without the model)
SLOT_TOKENS = 4096
SMOOTHING = 0.2  # weight of the newest timing in the step and prefill estimates


def window(prompt: Sequence[int], tokens: int, fim: tuple[int, int, int] | None = None) -> list[int]:
    """The part of a prompt the draft model reads: its last `tokens` at most, or for a
    fill-in-the-middle prompt (psm or spm, prompts.fim_ids) the same layout with the
    prefix's tail and the suffix's head (a repository layout's other files dropped).
    Tails start on prompts.grid_start's grid: while a person types at the end of the
    prefix, the window's start stays put and its KV is reused.

    >>> window(list(range(10)), 4)
    [6, 7, 8, 9]
    >>> P, S, M = 100, 101, 102
    >>> window([7, P, 1, 2, 3, 4, 5, 6, S, 8, 9, M], 5, (P, S, M))   # psm: 4 + 1
    [100, 3, 4, 5, 6, 101, 8, 102]
    >>> window([7, P, S, 8, 9, M, 1, 2, 3, 4, 5, 6], 5, (P, S, M))   # spm: text after the middle token
    [100, 101, 8, 102, 3, 4, 5, 6]
    """
    prompt = list(prompt)

    def tail(ids: list[int], budget: int) -> list[int]:
        return ids[grid_start(len(ids), budget):]

    if fim is not None and all(t in prompt for t in fim):
        p, s, m = (len(prompt) - 1 - prompt[::-1].index(t) for t in fim)
        if p < s < m:
            after = max(1, tokens // SUFFIX_SHARE)
            before = max(1, tokens - after)
            if s == p + 1:  # spm: <fim_prefix><fim_suffix> S <fim_middle> P
                return [prompt[p], prompt[s], *prompt[s + 1:m][:after], prompt[m], *tail(prompt[m + 1:], before)]
            return [prompt[p], *tail(prompt[p + 1:s], before), prompt[s], *prompt[s + 1:m][:after], *prompt[m:]]
    return tail(prompt, tokens)


def one_row_s(verifier: Verifier, slot: int, context: int | None = None) -> float:
    """The median of three one-row verify passes on `slot` (a free one, its contents
    garbage): over `context` cached tokens, else over what the slot holds."""
    times = []
    for _ in range(3):
        if context is not None:
            verifier.cache.prefilled(slot, [0] * context)
        began = time.perf_counter()
        verifier.verify([Item(slot, VerifyTree.chain(0))])
        times.append(time.perf_counter() - began)
    return sorted(times)[1]


@dataclass
class _Slot:
    """A request's place in the draft model's cache: the slot and the window it reads."""

    slot: int
    window: list[int]


class Drafter:
    """The draft model's forward, KV slots and measured costs (module docstring)."""

    def __init__(self, forward: Forward, *, window_tokens: int = WINDOW_TOKENS,
                 fim: tuple[int, int, int] | None = None, slots: int = SLOTS, slot_tokens: int = SLOT_TOKENS,
                 name: str = "") -> None:
        self.forward, self.name = forward, name
        self.window_tokens, self.fim = window_tokens, fim
        self.cache = SlotCache(forward.config, slots=slots, slot_tokens=min(slot_tokens, max_context(forward.config)),
                               dtype=forward.kv_dtype, device=forward.device)
        self.verifier = Verifier(forward, self.cache)
        # A draft is a guess: its bits need not equal a fresh prefill's, so every cached
        # prefix is reusable whatever the backend (kvcache.SlotCache.exact_prefix).
        self.cache.exact_prefix = True
        self.vocab_size = forward.config.vocab_size
        self._slots: dict[int, _Slot] = {}  # by id(run)
        self.step_s, self.prefill_token_s = self._measure()

    def _measure(self) -> tuple[float, float]:
        """A step's and a prefilled token's seconds, timed once at start-up (then
        updated by every draft): the engine prices the draft model with them."""
        slot, _ = self.cache.acquire([0])
        try:
            self.verifier.prefill(slot, [0] * 8)  # first touches of the slot and the buffers
            began = time.perf_counter()
            self.verifier.prefill(slot, [0] * 72, start=8)
            prefill = (time.perf_counter() - began) / 64
            return one_row_s(self.verifier, slot), prefill
        finally:
            self.cache.prefilled(slot, [])
            self.cache.release(slot)

    # -- what the engine asks before it drafts ----------------------------------------------
    def started(self, run: Any) -> bool:
        return id(run) in self._slots

    def context(self, run: Any) -> list[int]:
        """What the draft model reads for `run`: its prompt's window, then its output."""
        state = self._slots.get(id(run))
        return (state.window if state is not None else self.window_of(run.prompt)) + list(run.generated)

    def window_of(self, prompt: Sequence[int]) -> list[int]:
        return window(prompt, self.window_tokens, self.fim)

    def start_cost(self, run: Any) -> float:
        """Seconds the first draft of `run` spends prefilling its window (what a free
        slot does not already hold)."""
        context = self.context(run)
        return self.prefill_token_s * max(1, len(context) - self.cache.reusable(context))

    def fits(self, run: Any, tokens: int) -> bool:
        """Whether `tokens` more draft tokens fit the draft model's slot and vocabulary."""
        return len(self.context(run)) + tokens + 1 < self.cache.slot_tokens and (
            self.started(run) or self.cache.free_slots > 0)

    # -- drafting -----------------------------------------------------------------------------
    def draft(self, wants: Sequence[tuple[Any, int]]) -> list[Draft]:
        """For each (run, k): k tokens the draft model writes greedily after the run's
        context, as a chain Draft (empty where no slot is free). The first step catches
        each slot up with what the last verify pass committed, for all the runs in one
        pass (a run's first draft prefills its window alone); each further step is one
        pass for all the runs."""
        tokens: list[list[int]] = [[] for _ in wants]
        slots = self._catch_up([run for run, _ in wants], tokens)
        for step in range(1, max((k for _, k in wants), default=0)):
            live = [i for i, (_, k) in enumerate(wants) if slots[i] is not None and step < k]
            if not live:
                break
            stepped = time.perf_counter()
            results = self.verifier.verify([Item(slots[i], VerifyTree.chain(tokens[i][-1])) for i in live])
            self.step_s += SMOOTHING * (time.perf_counter() - stepped - self.step_s)
            for i, result in zip(live, results):
                tokens[i].append(int(result.committed[-1]))
        # an id past the large model's vocabulary would read past its embedding table
        return [Draft.chain(ids, [1] * len(ids), 0, MODEL_SOURCE) if all(0 <= t < self.vocab_size for t in ids)
                else Draft.empty(MODEL_SOURCE) for ids in tokens]

    def _catch_up(self, runs: Sequence[Any], out: list[list[int]]) -> list[int | None]:
        """Each run's slot (acquired at its first draft; None where none is free) made to
        hold its whole context, and the draft model's next token appended to its `out`."""
        slots: list[int | None] = []
        short = []  # (index, slot, start, the tokens to add): one pass for all of them
        for i, run in enumerate(runs):
            state = self._slots.get(id(run))
            context = self.context(run)
            if state is None:
                try:
                    slot, _ = self.cache.acquire(context)
                except CacheFull:
                    slots.append(None)
                    continue
                state = self._slots[id(run)] = _Slot(slot, context[: len(context) - len(run.generated)])
                run.on_close.append(lambda run=run: self.release(run))
            slots.append(state.slot)
            held = self.cache.tokens(state.slot)
            common = 0
            for a, b in zip(held, context[:-1]):
                if a != b:
                    break
                common += 1
            self.cache.prefilled(state.slot, context[:common])  # the rest of the slot is stale
            if len(context) - common <= SMALL_ROWS:
                short.append((i, state.slot, common, context[common:]))
                continue
            began = time.perf_counter()  # a window: prefilled in chunks, its cost per token measured
            logits = self.verifier.prefill(state.slot, context, start=common)
            self.prefill_token_s += SMOOTHING * ((time.perf_counter() - began) / (len(context) - common)
                                                 - self.prefill_token_s)
            out[i].append(int(self.forward.argmax(logits[-1:])[0]))
        if short:
            trees = [VerifyTree.chain(new[0], new[1:]) for _, _, _, new in short]
            chosen = self.forward.choices(self.cache, [(slot, start, tree)
                                                       for (_, slot, start, _), tree in zip(short, trees)])
            end = 0
            for (i, slot, _, new), tree in zip(short, trees):
                end += len(tree)
                self.cache.committed(slot, new)  # a chain's rows are written where they belong
                out[i].append(int(chosen[end - 1]))
        return slots

    def release(self, run: Any) -> None:
        """The run ended: its slot goes back (its tokens stay cached for the next prompt)."""
        state = self._slots.pop(id(run), None)
        if state is not None:
            self.cache.release(state.slot)


def draft_model_of(settings: Any) -> str | None:
    """The `--model` value of the draft model `settings.draft_model` names; None: none.

    >>> from codespec.settings import Settings
    >>> draft_model_of(Settings(model="qwen2.5-coder-1.5b", draft_model="auto")), draft_model_of(Settings())
    ('qwen2.5-coder-0.5b', None)
    """
    from codespec.models.default import packaged

    wanted = settings.draft_model.strip()
    if wanted.lower() == "auto":
        model = packaged(settings.model)
        return model.draft_model or None if model is not None else None
    return None if wanted.lower() in ("", "none") else wanted


def load_drafter(settings: Any, tokenizer: Any) -> Drafter | None:
    """The draft model `settings` name, loaded on this machine's backend; None: none.
    A clear error for one whose tokenizer differs from the model's."""
    from codespec.errors import CodespecError, ModelError
    from codespec.forward import select
    from codespec.prompts import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, special_id

    spec = draft_model_of(settings)
    if spec is None:
        return None
    # int8 weights where the C row decoder runs: a draft needs no bf16 bits, and int8 steps
    # cost ~30% less (the 0.5B on a Zen 4: 20 ms against 28)
    try:
        small = select.load(settings.model_copy(update={"model": spec, "quantize": "int8"}), progress=False)
    except ModelError:
        small = select.load(settings.model_copy(update={"model": spec, "quantize": "none"}), progress=False)
    why = compatible(tokenizer, small.tokenizer)
    if why is not None:
        raise CodespecError(f"draft model {spec}: {why}; a draft model must share the model's tokenizer "
                            f"(--draft-model none turns it off)")
    ids = tuple(special_id(tokenizer, t) for t in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE))
    fim = None if any(i is None for i in ids) else ids
    log.info("draft model: %s on %s", small.name, small.backend)
    return Drafter(small.forward, window_tokens=settings.draft_model_window, fim=fim, name=small.name)  # type: ignore[arg-type]


def compatible(large: Any, small: Any) -> str | None:
    """Why `small`'s tokenizer cannot draft for `large`'s (None: it can). Drafts are token
    ids: the same ids must mean the same text."""
    if large is None or small is None:
        return None
    if large.get_vocab() != small.get_vocab():
        return "its tokenizer's vocabulary differs from the model's"
    return None


FIXED_TOKENS = 4  # the chain and tree policies' draft from the model where nothing matches
EXPECTED_REST = 128  # the most output tokens a request's first prefill is weighed against
# A request's first model draft waits until its other sources have failed: START_AFTER
# passes committing at most START_BELOW tokens each on average. An edit's first pass
# often has nothing to copy yet, and a window's prefill there was lost to the copy that
# followed (the 1.5B's edit workload: 17.1 s without the draft model, 20.2 s with it).
START_AFTER, START_BELOW = 4, 2.0
SMALL_ROWS = 8  # passes of at most this many rows cost about what one row does (SmallPass)


@dataclass
class SmallPass:
    """What a verify pass of the large model costs while it reads its weights once: from
    one row up to SMALL_ROWS, about the same (the 1.5B on a Zen 4 at 1,000 tokens: 91 ms
    for one row, 99 ms for five). The goodput controller's cost line, fitted over every
    pass up to 64 rows, put them at ~60 ms, which made the draft model's 29 ms steps look
    twice their share: the draft model is priced against this, timed at start-up and
    followed with every small pass."""

    seconds: float

    def observe(self, rows: int, seconds: float) -> None:
        if rows <= SMALL_ROWS:
            self.seconds += SMOOTHING * (seconds - self.seconds)

    def cost(self, cost: controller.CostModel, rows: int, keys: int) -> float:
        return max(self.seconds, cost.cost(rows, keys)) if rows <= SMALL_ROWS else cost.cost(rows, keys)


def tokens_to_draft(run: Any, offered: Draft | controller.Offered, cost: controller.CostModel,
                    drafter: Drafter, context: int, small: SmallPass | None = None) -> int:
    """How many tokens the draft model writes for `run` before this pass: 0 where its
    drafts would not pay. The fixed policies (`offered` a Draft) use it where nothing
    matched. The goodput controller prices it (`offered`: the run's other sources): the
    best of those alone gives G0 committed tokens per second; k model tokens give
    (1 + sum of P(first d accepted)) / (pass(1 + k rows) + k draft steps), with the
    run's calibrated rate of the draft model at each depth. The best k must beat G0,
    and a run's first draft waits until its other sources have failed (START_AFTER,
    START_BELOW) and the seconds it saves on the rest of the output (at most
    EXPECTED_REST tokens) over plain steps outweigh the window's prefill."""
    budget = run.draft_budget()
    if budget <= 0 or run.plain:
        return 0
    if isinstance(offered, Draft):
        k = 0 if len(offered) else min(budget, FIXED_TOKENS)
        return k if k and drafter.fits(run, k) else 0

    def price(rows: int, keys: int) -> float:
        return small.cost(cost, rows, keys) if small is not None else cost.cost(rows, keys)

    best = controller.pick_priced(offered.candidates, run.acceptance.rate, cost, context)
    alone = (1.0 + sum(best.probs)) / price(1 + len(best), cost.draft_keys(context, best.draft, list(best.depths)))
    chosen, goodput, p, expected = 0, alone, 1.0, 1.0
    for k in range(1, budget + 1):
        p *= run.acceptance.rate(k - 1, controller.MODEL_SOURCE)
        expected += p
        seconds = price(1 + k, cost.attended_keys(context, [(1 + k, k)])) + k * drafter.step_s
        if expected / seconds > goodput:
            chosen, goodput = k, expected / seconds
    if not chosen or not drafter.fits(run, chosen):
        return 0
    if not drafter.started(run):
        stats = run.stats
        if stats.verify_passes < START_AFTER or stats.committed_in_passes > START_BELOW * stats.verify_passes:
            return 0  # the other sources have not failed yet (or copy well): no prefill for the model
        plain = 1.0 / price(1, cost.attended_keys(context, [(1, 0)]))
        rest = min(run.stop.max_new_tokens - len(run.generated), EXPECTED_REST)
        if rest * (1.0 / plain - 1.0 / goodput) < drafter.start_cost(run):
            return 0
    return chosen
