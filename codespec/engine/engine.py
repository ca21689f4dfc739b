"""The engine: prefill, then batched verify passes until each request stops.

A `Run` is one request's life: its KV slot, proposer session, stop condition and stats
(run.py, with the request's GenerationConfig and its Generation). `Engine.step(runs)`
advances several runs at once: each new run is prefilled (reusing a cached prompt
prefix when a slot holds one), and all the others share one verify pass;
it returns the tokens each run committed, so callers can stream them. The scheduler
calls it with every active request; `Engine.advance` and `Engine.generate` drive one run.

    engine = Engine(loaded.forward, loaded.tokenizer, PromptLookupProposer())   # forward.load(settings)
    out = engine.generate(tokenizer.encode("def fib(n):"), GenerationConfig(max_new_tokens=64))
    out.text, out.stats.accepted_tokens_per_pass

With `speculate=False` a run asks for no drafts, so each of its verify passes is a plain
decode step: that is the reference the lossless tests compare against.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from codespec import prompts
from codespec.engine import ahead
from codespec.engine import drafter as drafter_module
from codespec.engine.drafter import Drafter
from codespec.engine.kvcache import DEFAULT_CHUNK, CacheFull, Preempted, SlotCache
from codespec.engine.run import Generation, GenerationConfig, Run, acceptance_of
from codespec.engine.stats import HostClock
from codespec.engine.stopping import StopCondition
from codespec.errors import RequestError
from codespec.forward import profile
from codespec.forward.base import Forward, eos_ids, max_context
from codespec.index import Draft, SuffixIndex
from codespec.policy import controller, fastchoice
from codespec.policy.proposer import IndexedProposer, NoProposer, PromptLookupProposer, Proposer
from codespec.settings import Settings
from codespec.verify.tree import Item, VerifyTree
from codespec.verify.verifier import Verifier

log = logging.getLogger(__name__)
COST_ROWS = (2, 4, 8, 16, 32, 48, 64)  # verify pass sizes timed when the controller starts,
COST_CONTEXTS = (512, 2048)  # at these context lengths (two, to tell row cost from key cost)
# On a quiet machine the thread that runs a CPU pass is on a core the whole pass (the row
# decoder's OpenMP master, transformers' caller): its CPU time over the pass's wall time
# came to 1.00 on the 2-core VM (row decoder and transformers), 0.50 with two busy
# processes beside it (passes 3.4x slower), and 0.62 / 0.09 with a busy Python thread in
# the same process (which the process's CPU time over its threads missed: 0.99 on the row
# decoder). Under this share the calibration's timings are not stored.
QUIET_SHARE = 0.8


class Engine:
    """Greedy or sampled generation with speculation, over one forward backend
    (forward/base.py) chosen at start-up."""

    def __init__(
        self,
        forward: Forward,
        tokenizer: Any = None,
        proposer: Proposer | None = None,
        *,
        max_draft_tokens: int = 16,
        draft_policy: controller.DraftPolicy = "chain",
        eos_token_ids: Iterable[int] | None = None,
        cache: SlotCache | None = None,
        slots: int = 2,
        profile_dir: Path | str | None = None,
        look_ahead: bool | None = None,
        drafter: Drafter | None = None,
    ) -> None:
        """`profile_dir`: the cache directory holding this machine's profile (probes and
        verify-pass timings, forward/profile.py): read at start, written once measured.
        `look_ahead`: the goodput controller drafts each request's next pass on a guess
        while a pass computes (engine/ahead.py); default: where the backend launches
        passes asynchronously (a GPU's). `drafter`: a smaller model that drafts where
        the proposer's sources have nothing (engine/drafter.py)."""
        if draft_policy not in controller.POLICIES:
            raise ValueError(f"draft_policy must be one of {controller.POLICIES}, got {draft_policy!r}")
        self.forward = forward
        self.max_context = max_context(forward.config)
        if cache is None:
            cache = SlotCache(forward.config, slots=slots, slot_tokens=min(self.max_context, 4096),
                              dtype=forward.kv_dtype, device=forward.device, chunk=DEFAULT_CHUNK)
        self.cache = cache
        self.profile_dir = profile_dir
        self.profile_key: dict[str, str] | None = None
        stored = None
        if profile_dir is not None:
            self.profile_key = forward.profile_key()
            stored = profile.load(profile_dir, self.profile_key)
        # the probes' results on this very setting: the backend skips probing
        probes = (stored.row_block, stored.padded_rows) if stored is not None and stored.row_block else None
        self.verifier = Verifier(forward, cache, probes)
        self.tokenizer = tokenizer
        self.proposer = proposer if proposer is not None else PromptLookupProposer()
        self.drafter = drafter
        self.small_pass: drafter_module.SmallPass | None = None  # timed below, where a drafter is priced
        self.max_draft_tokens = max_draft_tokens
        self.draft_policy = draft_policy
        self.eos_token_ids = frozenset(eos_token_ids if eos_token_ids is not None
                                       else eos_ids(forward.generation_config, tokenizer))
        self.cost = controller.CostModel(block=self.verifier.row_block, key_span=self.verifier.key_span,
                                         min_rows=forward.min_rows)
        self.acceptance = controller.AcceptanceTable()  # every request's record, by match length
        self.clock = HostClock()  # steps' time in the forward and around it (bench verify's host ms/pass)
        self.calibration_share: float | None = None  # calibrate's busy_share, where it measured
        self.look_ahead = forward.asynchronous if look_ahead is None else look_ahead
        if stored is not None:
            self.cost.calibrated_with(stored.timings)
        elif profile_dir is not None:
            self._store_profile([])  # the probes just run: the next process skips them
        if forward.warm_up_pass:
            self._warm_up_pass()
        if drafter is not None:
            self.small_pass = drafter_module.SmallPass(self._time_small_pass())

    def _warm_up_pass(self) -> None:
        """One decode step on a free slot at start-up, for backends whose first pass over a
        KV cache costs seconds (the cuda backend compiles its functions and captures the
        cache's graph): that cost belongs to start-up, not to the first request. Then a
        tree's accepted path kept: the KV compaction's kernel is compiled (or loaded from
        Triton's cache) here too, not in the first request whose draft takes a branch
        (0.3+ s in a fresh process on an H100, 2026-11-27)."""
        if not self.cache.free_slots:
            return
        slot, _ = self.cache.acquire([0])
        try:
            self.forward.choices(self.cache, [(slot, 0, VerifyTree.chain(0))])
            self.forward.keep(self.cache, [(slot, 0, [1])])  # node 1 onto position 1: in place
        finally:
            self.cache.prefilled(slot, [])  # position 0 was written: the slot holds nothing reusable
            self.cache.release(slot)

    def _time_small_pass(self) -> float:
        """The median of three one-row passes over 1,000 cached tokens, on a free slot: what
        the draft model's steps are priced against (drafter.SmallPass)."""
        slot, _ = self.cache.acquire([0])
        try:
            return drafter_module.one_row_s(self.verifier, slot, min(1000, self.cache.slot_tokens // 2))
        finally:
            self.cache.prefilled(slot, [])
            self.cache.release(slot)

    @classmethod
    def from_settings(cls, forward: Forward, tokenizer: Any, settings: Settings,
                      index: SuffixIndex | None = None) -> Engine:
        """An engine whose proposer drafts from the request's context, and from `index`
        (repository, past generations) when one is given, with the draft model
        `settings.draft_model` names; its KV slots fill `settings.kv_cache_mb`."""
        match = dict(min_match_tokens=settings.min_match_tokens, max_match_tokens=settings.max_match_tokens)
        proposer: Proposer = PromptLookupProposer(**match) if index is None else IndexedProposer(index, **match)
        cache = SlotCache.within_budget(
            forward.config, budget_mb=settings.kv_cache_mb,
            slot_tokens=min(settings.kv_slot_tokens, max_context(forward.config)),
            dtype=forward.kv_dtype, device=forward.device, chunk=settings.prefill_chunk_tokens,
        )
        return cls(forward, tokenizer, proposer, max_draft_tokens=settings.max_draft_tokens,
                   draft_policy=settings.draft_policy, cache=cache, profile_dir=settings.cache_dir,
                   look_ahead=look_ahead_of(settings), drafter=drafter_module.load_drafter(settings, tokenizer))

    @property
    def context_limit(self) -> int:
        """Most tokens (prompt + output) one request may hold."""
        return min(self.max_context, self.cache.slot_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return prompts.decode(self.tokenizer, token_ids)

    def start(self, prompt_ids: Sequence[int], config: GenerationConfig) -> Run:
        """A run for the request, its prompt checked (`check_prompt`)."""
        prompt = [int(t) for t in prompt_ids]
        room = self.check_prompt(prompt)
        self.check_prediction(prompt, config.prediction)
        stop = StopCondition(self.eos_token_ids | config.end_ids, min(config.max_new_tokens, room), config.stop,
                             self.decode if self.tokenizer is not None else None, config.min_indent, config.end_at)
        proposer = self.proposer if config.speculate else NoProposer()
        constraint = config.grammar.start() if config.grammar is not None else None
        return Run(prompt, config, stop=stop, session=proposer.start(prompt, config.prediction),
                   plain=isinstance(proposer, NoProposer) or self.max_draft_tokens == 0,
                   accept=acceptance_of(config, self.forward.device, constraint), constraint=constraint,
                   acceptance=controller.Acceptance(self.acceptance), max_draft=self.max_draft_tokens,
                   decode=self.decode, release=self.cache.release)

    def check_prompt(self, prompt: Sequence[int]) -> int:
        """The tokens a request with this prompt may generate; one clear RequestError for a
        prompt this engine cannot take (the one check: the server asks it before a stream
        starts, `start` again)."""
        if not prompt:
            raise RequestError("the prompt is empty: give at least one token")
        # Every backend gathers the embedding row of each id unchecked (the row decoder's C,
        # the cuda backend's Triton gather): an id outside the table would read past it.
        vocab = self.forward.config.vocab_size
        lowest, highest = min(prompt), max(prompt)
        if lowest < 0 or highest >= vocab:
            bad = lowest if lowest < 0 else highest
            raise RequestError(f"token id {bad} is outside the model's vocabulary (ids 0 to {vocab - 1})")
        # Drafts never exceed the tokens still allowed, so a pass's rows fit in this room too.
        room = self.context_limit - len(prompt)
        if room < 1:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens; this server's context holds {self.context_limit} "
                f"(model: {self.max_context}, KV slot: {self.cache.slot_tokens} tokens; see --kv-slot-tokens)")
        return room

    def check_prediction(self, prompt: Sequence[int], prediction: Sequence[int]) -> None:
        """One clear RequestError for a predicted output longer than the output may be."""
        room = self.context_limit - len(prompt)
        if len(prediction) > room:
            raise RequestError(f"the prediction has {len(prediction)} tokens; after the prompt's {len(prompt)} this "
                               f"server's context holds {room} more")

    def advance(self, run: Run) -> list[int]:
        """Prefill (first call) or one verify pass of `run` alone; the tokens it committed.
        Raises what ended the run, where it failed."""
        assert not run.done, "advance() after the run finished"
        kept = self.step([run])[0]
        if run.error is not None:
            raise run.error
        return kept

    def prefill_ahead(self, prompt_ids: Sequence[int], preempted: Callable[[], bool] | None = None) -> int | None:
        """Background work: the KV of the next prefill pass (a whole chunk, or a
        sub-chunk of the last one) of a prompt a request is likely to send soon, into the
        free slot that shares most of it. Returns the tokens computed (0: pre-empted),
        None when nothing is left to do (its whole passes are cached, or no slot is free).
        Only the passes a request's own prefill runs (kvcache.spans), so a request that
        reuses them gets exactly the bits a fresh prefill would: no output depends on this.
        `preempted` is asked between layers (backends that run transformers' layers) and
        ends the chunk early, dropped, when it says True: a request came."""
        prompt = [int(t) for t in prompt_ids][: self.context_limit]
        target = self.cache.reusable_end(len(prompt))  # what a request could reuse of it
        if target <= 0 or not self.cache.free_slots:
            return None
        slot, cached = self.cache.acquire(prompt)
        try:
            if cached >= target:
                return None
            # the next pass its own prefill would run, short of the last token a request
            # computes anyway (with exact prefix reuse a pass may end anywhere)
            end = min(self.cache.spans(len(prompt), cached)[0][1], target)
            self.cache.preempted = preempted
            try:
                self.verifier.prefill(slot, prompt[:end], start=cached)
            except Preempted:
                return 0  # the slot's length never moved: the pass's KV is garbage past it
            finally:
                self.cache.preempted = None
            return end - cached
        finally:
            self.cache.release(slot)

    def generate(self, prompt_ids: Sequence[int], config: GenerationConfig = GenerationConfig()) -> Generation:
        run = self.start(prompt_ids, config)
        try:
            while not run.done:
                self.advance(run)
        finally:
            run.close()
        return run.result()

    # -- one step of many runs -----------------------------------------------------------
    def step(self, runs: Sequence[Run], prefill_next: bool = False) -> list[list[int]]:
        """Prefill the new runs and verify all the others in one pass; returns each run's
        committed tokens (in the order of `runs`). A failure that belongs to one run (its
        prefill, its draft) ends that run alone with `run.error` set; a failed batched
        pass ends every run in it. `prefill_next`: the caller will prefill a request
        before the next pass (no plain step is queued behind this one: it would be dropped)."""
        began, in_forward, overlapped = time.perf_counter(), self.verifier.forward_s, self.verifier.overlapped_s
        try:
            return self._step(runs, prefill_next)
        finally:
            self.clock.steps += 1
            self.clock.step_s += time.perf_counter() - began
            self.clock.forward_s += self.verifier.forward_s - in_forward
            self.clock.overlapped_s += self.verifier.overlapped_s - overlapped

    def _step(self, runs: Sequence[Run], prefill_next: bool = False) -> list[list[int]]:
        committed: dict[int, list[int]] = {}
        ready = [run for run in runs if run.prefilled and not run.done]
        for run in runs:
            if not run.prefilled:
                committed[id(run)] = run.guarded(lambda r=run: self._prefill(r))
        drafts = [run.guarded(lambda r=run: self._draft(r)) for run in ready]
        ready, drafts = [r for r in ready if not r.done], [d for r, d in zip(ready, drafts) if not r.done]
        if ready and self.drafter is not None:
            drafts = self._with_model_drafts(ready, drafts)
        if ready:
            try:
                outs = self._verify(ready, drafts, prefill_next)
            except Exception as exc:
                for run in ready:
                    run.fail(exc)
                outs = [[] for _ in ready]
            for run, kept in zip(ready, outs):
                committed[id(run)] = kept
        return [committed.get(id(run), []) for run in runs]

    def _prefill(self, run: Run) -> list[int]:
        """The run's prompt into a KV slot (reusing what one holds of it), its first token."""
        if run.slot is None:
            run.slot, reused = self.cache.acquire(run.prompt)
            run.stats.cached_prompt_tokens = reused
        logits = self.verifier.prefill(run.slot, run.prompt, start=run.stats.cached_prompt_tokens)
        return run.prefilled_with(self.verifier.first(logits, run.accept))

    @property
    def _controlled(self) -> bool:
        """Whether the goodput controller drafts: only once its cost model can price
        passes. Before that (no stored calibration, too few passes seen) the chain
        policy's prior drafts, k tokens for a k-token match: a request never waits for
        a calibration."""
        return self.draft_policy == "goodput" and self.cost.ready

    def _draft(self, run: Run) -> Draft | controller.Offered:
        if not self._controlled:
            return run.allowed(run.session.draft(run.draft_budget(), tree=self.draft_policy == "tree"))
        # the controller prices every node by its calibrated acceptance, so its trees may
        # run deeper than k tokens for a k-token match (the fixed policies' safety cap),
        # and it picks among the sources by expected goodput instead of by match length:
        # with the whole batch, in _verify
        guessed, run.guess = run.guess, None
        if guessed is not None and run.last_kept == guessed.tokens and run.draft_budget() == guessed.budget:
            run.session.set_state(guessed.state)  # the context is the guessed one: drafted already
            self.clock.guesses_taken += 1
            return controller.Offered(run.allowed_all(guessed.candidates))
        return controller.Offered(run.allowed_all(run.session.candidates(run.draft_budget())))

    def _with_model_drafts(self, runs: Sequence[Run], drafts: list[Draft | controller.Offered]
                           ) -> list[Draft | controller.Offered]:
        """The draft model's drafts added where they pay (drafter.tokens_to_draft): one more
        candidate for the goodput controller, the draft where a fixed policy had none."""
        assert self.drafter is not None
        wants = []
        for i, (run, offered) in enumerate(zip(runs, drafts)):
            k = drafter_module.tokens_to_draft(run, offered, self.cost, self.drafter, self.cache.length(run.slot),
                                               self.small_pass)
            if k:
                wants.append((i, k))
        if not wants:
            return drafts
        try:
            made = self.drafter.draft([(runs[i], k) for i, k in wants])
        except Exception:  # noqa: BLE001 (a draft is a guess: without it the pass is still right)
            log.warning("the draft model failed; this pass drafts without it", exc_info=True)
            return drafts
        out = list(drafts)
        for (i, _), draft in zip(wants, made):
            draft = runs[i].allowed(draft)
            if not len(draft):
                continue
            offered = out[i]
            out[i] = (controller.Offered([*offered.candidates, draft]) if isinstance(offered, controller.Offered)
                      else draft)
        return out

    def _choose(self, runs: Sequence[Run], offered: list[controller.Offered]) -> list[Draft]:
        """The controller's drafts for the pass: each request's best source, pruned, then the
        batch's nodes by expected goodput (fastchoice.py; the reference where costs are padded)."""
        contexts = [self.cache.length(run.slot) for run in runs]
        candidates = [o.candidates for o in offered]
        drafts = fastchoice.choose_all(candidates, [run.acceptance for run in runs], self.cost, contexts)
        if drafts is None:
            picked = [controller.pick_priced(c, run.acceptance.rate, self.cost, context)
                      for c, run, context in zip(candidates, runs, contexts)]
            drafts = [p.draft for p in controller.choose_priced(picked, self.cost, contexts)]
        return drafts

    def _verify(self, runs: Sequence[Run], drafted: list[Draft | controller.Offered],
                prefill_next: bool = False) -> list[list[int]]:
        # the controller's offers are chosen with the whole batch; the fixed policies' drafts stand
        drafts = self._choose(runs, drafted) if isinstance(drafted[0], controller.Offered) else drafted
        limit = self.forward.max_tail  # a backend's deepest branch (forward/base.py)
        if limit is not None:
            drafts = [d if len(d) <= limit else d.within_tail(limit) for d in drafts]
        trees = [VerifyTree.build(run.generated[-1], draft) for run, draft in zip(runs, drafts)]
        items = [Item(run.slot, tree, run.accept) for run, tree in zip(runs, trees)]
        starts = [self.cache.length(run.slot) for run in runs]
        self.clock.passes += 1
        rows = sum(len(tree) for tree in trees)
        keys = sum(self.cost.tree_keys(start, tree) for tree, start in zip(trees, starts))
        during = None
        if self.look_ahead and self._controlled:  # no longer than the pass is priced to take
            during = functools.partial(self._guess, runs, trees, 0.8 * self.cost.cost(rows, keys))
        began = time.perf_counter()
        results = self.verifier.verify(items, during, chain_next=not prefill_next and self._plain_next(runs, trees))
        seconds = time.perf_counter() - began
        self.cost.observe(rows, seconds, keys)
        if self.small_pass is not None:
            self.small_pass.observe(rows, seconds)
        return [run.after_pass(draft, tree, result) for run, draft, tree, result in zip(runs, drafts, trees, results)]

    @staticmethod
    def _plain_next(runs: Sequence[Run], trees: list[VerifyTree]) -> bool:
        """Whether this pass and every run's next one are plain greedy steps (no draft now
        and none possible, greedy, the token limit not reached after this pass): a GPU
        backend queues the next step behind this pass (forward/cuda/chained.py). A run that
        stops on an end token wastes the queued step, nothing more."""
        return all(len(tree) == 1 and run.plain and run.accept is None
                   and run.stop.max_new_tokens - len(run.generated) > 1 for run, tree in zip(runs, trees))

    def _guess(self, runs: Sequence[Run], trees: list[VerifyTree], seconds: float) -> None:
        """While the pass computes: each run's next draft on a guess of what it commits
        (engine/ahead.py), for at most `seconds` (past the pass, guessing would delay the
        next one). A failed guess is no guess: it must never fail a request."""
        until = time.perf_counter() + seconds
        for run, tree in zip(runs, trees):
            run.guess = None
            if time.perf_counter() > until:
                continue
            try:
                run.guess = ahead.guess(run, tree, self.max_draft_tokens)
            except Exception:  # noqa: BLE001 (the session is back in its state: ahead.guess's finally)
                log.debug("drafting ahead failed", exc_info=True)
                run.guess = None
            self.clock.guesses += run.guess is not None

    def calibrate(self, again: bool = False) -> None:
        """Time verify passes of growing size once, on a free slot, for the goodput
        controller, and store them in the machine profile: start-up work (`codespec
        model prepare`, `serve` and `lsp` call it; requests never do). A no-op when a
        stored profile already calibrated the cost model, unless `again` (`model prepare
        --recalibrate`). On a CPU, timings taken while other processes or threads held
        the cores (`busy_share`) price this process's passes and are not stored: the next
        start measures again."""
        if self.draft_policy != "goodput" or not self.cache.free_slots:
            return
        if again:
            self.cost = controller.CostModel(block=self.cost.block, key_span=self.cost.key_span,
                                             min_rows=self.cost.min_rows)
        elif self.cost.calibrated:
            return
        slot, _ = self.cache.acquire([0])
        # Passes attend to contexts of typical lengths (their KV values do not matter).
        contexts = sorted({min(c, self.cache.slot_tokens // 2) for c in COST_CONTEXTS})
        spent = [0.0, 0.0]  # the passes' wall seconds, and the CPU seconds of the thread that ran them
        try:
            limit = self.cache.slot_tokens - max(contexts) - 2

            def timed(rows: int, context: int) -> float:
                self.cache.prefilled(slot, [0] * context)
                began, used = time.perf_counter(), time.thread_time()
                self.verifier.verify([Item(slot, VerifyTree.chain(0, [0] * (rows - 1)))])
                wall = time.perf_counter() - began
                spent[0] += wall
                spent[1] += time.thread_time() - used
                return wall

            timings = self.cost.measure(timed, [n for n in COST_ROWS if n < limit], contexts)
        finally:
            self.cache.prefilled(slot, [])
            self.cache.release(slot)
        self.calibration_share = busy_share(self.profile_key, *spent)
        if self.calibration_share is not None and self.calibration_share < QUIET_SHARE:
            log.warning("the machine was busy while codespec timed its verify passes (they ran %.0f%% of the time): "
                        "the timings steer this process only, and are timed again at the next start (`codespec "
                        "model prepare`, serve or lsp) on a quiet machine", 100 * self.calibration_share)
            timings = []
        self._store_profile(timings)

    def _store_profile(self, timings: list[tuple[int, int, float]]) -> None:
        if self.profile_dir is None or self.profile_key is None:
            return
        profile.save(self.profile_dir, profile.Profile(
            self.profile_key, self.verifier.row_block, self.verifier.padded_rows, timings,
            share=self.calibration_share))

    @property
    def profile_path(self) -> Path | None:
        """Where this engine's machine profile is (or would be) stored."""
        if self.profile_dir is None or self.profile_key is None:
            return None
        return profile.profile_path(self.profile_dir, self.profile_key)


def look_ahead_of(settings: Settings) -> bool | None:
    """Settings.look_ahead as Engine's `look_ahead` (None: the backend decides)."""
    return {"on": True, "off": False}.get(settings.look_ahead)


__all__ = ["CacheFull", "Engine", "Generation", "GenerationConfig", "Run"]


def busy_share(key: dict[str, str] | None, wall: float, cpu: float) -> float | None:
    """The share of their wall time a CPU backend's timed passes ran: `cpu` seconds of the
    thread that ran them (time.thread_time) over `wall` seconds. ~1 on a quiet machine,
    lower while other processes or this process's other threads hold the cores. None
    where it says nothing: a GPU's passes (the device's time), or no key or time."""
    if key is None or not key.get("device", "").startswith("cpu") or wall <= 0:
        return None
    return cpu / wall
