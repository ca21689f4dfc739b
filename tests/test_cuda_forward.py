"""The `cuda` backend's layout (forward/cuda/forward.py), checked on CPU where it runs eagerly
with the attention's torch reference: float64 tiny models, so a failure means the layout
is wrong, not rounding. Its CUDA run (graphs, the Triton kernel, bf16) is
`codespec check`'s.

Buckets of 8 rows here, so that 16-token drafts and batched trees run as several replays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from codespec.engine.engine import Engine, GenerationConfig
from codespec.engine.kvcache import SlotCache
from codespec.engine.scheduler import Scheduler
from codespec.errors import SettingError
from codespec.forward.cuda import forward as cuda
from codespec.forward.cuda.forward import CudaForward
from codespec.forward.cuda.passlayout import chain_rows, fill_staging, pass_rows, tree_rows
from codespec.forward.cuda.settings import CudaSettings, launches_pdl
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.verify.tree import VerifyTree
from tests.test_engine_lossless import hf_greedy, prompts, speculation_checked
from tests.test_scheduler import run_all


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("policy", ["chain", "tree"])
def test_speculative_equals_plain_across_replays(arch, policy):
    accepted = rejected = 0
    for vocab, repeat in ((16, True), (128, False)):
        model = tiny_model(arch, vocab_size=vocab, seed=3)
        engine = Engine(CudaForward(model, CudaSettings(rows=8)), None, PromptLookupProposer(min_match_tokens=1),
                        max_draft_tokens=16, eos_token_ids=[], draft_policy=policy)
        more_accepted, more_rejected = speculation_checked(engine, prompts(vocab, 6, seed=vocab, repeat=repeat), 40)
        accepted, rejected = accepted + more_accepted, rejected + more_rejected
    assert accepted > 20 and rejected > 20, (accepted, rejected)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_plain_decoding_equals_transformers_generate(kv_heads):
    """The backend is the model: its own forward (prefill chunks, then one-row steps in
    the bucket) gives transformers' greedy output."""
    model = tiny_model("qwen2", vocab_size=64, seed=5, num_key_value_heads=kv_heads)
    engine = Engine(CudaForward(model, CudaSettings(rows=4)), None, eos_token_ids=[])
    for prompt in prompts(64, 3, seed=1, repeat=False):
        hf = hf_greedy(model, prompt, 24)
        assert engine.generate(prompt, GenerationConfig(max_new_tokens=24, speculate=False)).token_ids == hf


def test_batched_requests_equal_each_alone():
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = Engine(CudaForward(model, CudaSettings(rows=8)), None, PromptLookupProposer(min_match_tokens=1), eos_token_ids=[],
                    slots=4, max_draft_tokens=8)
    batch = [[1, 2, 3, 4] * 2, [5, 6, 7] * 3, [9, 1, 9, 2], [3, 3, 4] * 3]
    config = GenerationConfig(max_new_tokens=24)
    scheduler = Scheduler(engine, max_active=4, max_waiting=4)
    try:
        together = run_all(scheduler, batch, config)
    finally:
        scheduler.close()
    alone = [engine.generate(p, GenerationConfig(max_new_tokens=24, speculate=False)).token_ids for p in batch]
    assert [o.token_ids for o in together] == alone


def test_a_row_equals_its_decode_step_bit_for_bit_wherever_its_keys_sit():
    """A tree row off the main chain (its ancestors scattered in the slot) gets the same
    logits as the decode step that sees the same keys laid out contiguously."""
    model = tiny_model("qwen2", vocab_size=32, seed=7, dtype=torch.float32)
    forward = CudaForward(model, CudaSettings(rows=8))
    engine = Engine(forward, None, eos_token_ids=[], slots=2)
    cache = engine.cache
    prompt = list(range(1, 20))
    for slot in (0, 1):
        cache.acquire(prompt)
        forward.prefill(cache, slot, prompt, 0)
    assert_tree_rows_are_steps(forward, cache, len(prompt))


def assert_tree_rows_are_steps(forward: CudaForward, cache, start: int) -> None:
    """Slot 0 verifies a tree 0 -> {1, 2}, 2 -> 3 (node 3 sees nodes 0, 2 and 3, at
    positions start, +2, +3); slot 1, holding the same prompt, decodes its tokens 5, 7, 8
    one by one, as plain decoding writes them: each tree row has its step's logits."""
    tree = VerifyTree(tokens=(5, 6, 7, 8), parents=(-1, 0, 0, 2), depths=(0, 1, 1, 2), draft_nodes=(0, 1, 2))
    tree_logits = forward.logits(cache, [(0, start, tree)])
    steps = [forward.logits(cache, [(1, start + i, VerifyTree.chain(token))]) for i, token in enumerate((5, 7, 8))]
    assert torch.equal(tree_logits[0], steps[0][0])
    assert torch.equal(tree_logits[2], steps[1][0])
    assert torch.equal(tree_logits[3], steps[2][0])
    assert not torch.equal(tree_logits[1], steps[1][0])  # node 1 (token 6) is another row


def test_rows_and_padding_layout():
    tree = VerifyTree(tokens=(7, 8, 9), parents=(-1, 0, 0), depths=(0, 1, 1), draft_nodes=(0, 1))
    rows = list(pass_rows([(2, 10, tree)]))
    assert rows == [(7, 10, 2, 10, 11, []), (8, 11, 2, 11, 12, []), (9, 11, 2, 12, 11, [12])]
    staging = np.full(cuda.META_FIELDS * 4 + 16, -1, dtype=np.int64)
    assert fill_staging(staging, tree_rows([(2, 10, tree)]), 0, 4) == 3
    meta = staging[: cuda.META_FIELDS * 4].reshape(cuda.META_FIELDS, 4)
    assert meta[:, 3].tolist() == [7, 10, 2, 10, 0, 2, 0, 0]  # padding: row 0's write, no keys
    assert meta[4].tolist() == [0, 1, 2, 0] and meta[6].tolist() == [11, 12, 11, 0]
    assert staging[cuda.META_FIELDS * 4:].reshape(4, 4).tolist() == [[0] * 4, [0] * 4, [12, 0, 0, 0], [0] * 4]


def random_requests(rng: np.random.Generator, slots: int, nodes: tuple[int, int], start: int) -> list:
    """A pass's (slot, start, tree) requests: 1 to slots - 1 of them, each a draft tree of
    nodes[0] to nodes[1] - 1 nodes (branching at random, cut to the bucket of 8 as the
    engine cuts them) at a start below `start`."""
    from codespec.index import Draft

    requests = []
    for slot in range(int(rng.integers(1, slots))):
        n = int(rng.integers(*nodes))
        parents = tuple(int(rng.integers(-1, i)) if rng.random() < 0.4 else i - 1 for i in range(n))
        draft = Draft(tuple(int(t) for t in rng.integers(0, 100, n)), parents, (1,) * n, 1, "test").within_tail(8)
        requests.append((slot, int(rng.integers(0, start)), VerifyTree.build(int(rng.integers(0, 100)), draft)))
    return requests


@pytest.mark.parametrize("seed", range(4))
def test_the_pass_layout_is_pass_rows_bucket_by_bucket(seed):
    """tree_rows and chain_rows (numba, numpy) against pass_rows (the reference, one row at
    a time), each bucket's staging as a list of pass_rows' tuples lays it out."""
    requests = random_requests(np.random.default_rng(seed), slots=6, nodes=(0, 20), start=50)
    bucket = 8  # the engine cuts branches to the bucket (within_tail) before a pass
    reference = list(pass_rows(requests))
    assert any(row[5] for row in reference)
    for rows, expected in ((tree_rows(requests), reference),
                           (chain_rows(list(range(100, 140)), 3, 5, 25),
                            [(100 + p, p, 3, p, p + 1, []) for p in range(5, 25)])):
        for first in range(0, len(expected), bucket):
            part = expected[first:first + bucket]
            staging = np.full(cuda.META_FIELDS * bucket + bucket * bucket, -1, dtype=np.int64)
            assert fill_staging(staging, rows, first, bucket) == len(part)
            meta = staging[: cuda.META_FIELDS * bucket].reshape(cuda.META_FIELDS, bucket)
            path = staging[cuda.META_FIELDS * bucket:].reshape(bucket, bucket)
            for r, (token, position, slot, write, context, tail) in enumerate(part):
                assert meta[:, r].tolist() == [token, position, slot, write, r, slot, context, len(tail)]
                assert path[r].tolist() == tail + [0] * (bucket - len(tail))
            token, position, slot, write = part[0][:4]
            for r in range(len(part), bucket):  # padding
                assert meta[:, r].tolist() == [token, position, slot, write, 0, slot, 0, 0]
                assert path[r].tolist() == [0] * bucket


@pytest.mark.parametrize("seed", range(4))
def test_a_replay_writes_no_key_a_row_of_it_reads_below_its_context_less_the_bucket(seed):
    """What attention's early loads rest on (forward/cuda/attention.py, `early`): in every
    replay of a pass, each K and V write in a slot lands at or above context - bucket for
    every row of that replay in that slot, so a row's keys below that bound were written
    before the replay began. Trees spanning several replays, deep branches, and a prefill
    chunk's chain."""
    requests = random_requests(np.random.default_rng(100 + seed), slots=5, nodes=(1, 30), start=300)
    bucket = 8
    for rows in (tree_rows(requests), chain_rows(list(range(40)), 2, 3, 40)):
        checked = 0
        for first in range(0, len(rows), bucket):
            staging = np.zeros(cuda.META_FIELDS * bucket + bucket * bucket, dtype=np.int64)
            n = fill_staging(staging, rows, first, bucket)
            meta = staging[: cuda.META_FIELDS * bucket].reshape(cuda.META_FIELDS, bucket)
            for r in range(n):
                writes = [int(meta[3, w]) for w in range(n) if meta[2, w] == meta[5, r]]
                assert min(writes) >= meta[6, r] - bucket, (first, r)
                checked += 1
        assert checked == len(rows)


def test_unsupported_models_are_named():
    assert cuda.unsupported(tiny_model("qwen2", vocab_size=16)) is None
    assert "sliding" in cuda.unsupported(tiny_model("qwen2", vocab_size=16, use_sliding_window=True, sliding_window=8))
    dynamic = tiny_model("qwen2", vocab_size=16, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert "rotary embedding 'dynamic'" in cuda.unsupported(dynamic)  # cos and sin change with the pass


def test_start_up_runs_one_step_and_leaves_no_reusable_prefix(monkeypatch):
    """A backend with `warm_up_pass` gets one decode step at engine start-up (on CUDA:
    compilation and the cache's graph capture, outside the first request) and one kept
    path (the KV compaction's kernel); the slot it used holds nothing a prompt could
    reuse, so output is unchanged."""
    model = tiny_model("qwen2", vocab_size=64, seed=5)
    forward = CudaForward(model, CudaSettings(rows=4))
    calls, kept = [], []
    real, real_keep = forward.choices, forward.keep
    monkeypatch.setattr(forward, "choices", lambda cache, requests: calls.append(requests) or real(cache, requests))
    monkeypatch.setattr(forward, "keep", lambda cache, moves: kept.append(moves) or real_keep(cache, moves))
    forward.warm_up_pass = True
    engine = Engine(forward, None, eos_token_ids=[])
    assert len(calls) == 1 and engine.cache.free_slots == engine.cache.slots
    assert kept == [[(0, 0, [1])]]
    prompt = [0, 5, 9, 3]  # starts with the warm-up's token 0: nothing may be reused from that slot
    out = engine.generate(prompt, GenerationConfig(max_new_tokens=12, speculate=False))
    assert out.stats.cached_prompt_tokens == 0
    assert out.token_ids == hf_greedy(model, prompt, 12)


class _DeepBranches:
    """Drafts a short main chain and a second root whose branch runs 7 nodes deep, with
    tokens the tiny model may or may not choose: a branch longer than a 4-row bucket."""

    def start(self, prompt_ids, prediction=()):
        return self

    def extend(self, token_ids):
        pass

    def draft(self, budget, tree=False):
        from codespec.index import Draft

        n = min(budget, 9)
        parents = (-1, 0, -1, 2, 3, 4, 5, 6, 7)[:n]
        return Draft(tuple((3 * i + 1) % 16 for i in range(n)), parents, (2,) * n, match_len=3, source="test")

    def candidates(self, budget):
        return [self.draft(budget)]

    def finish(self, generated):
        pass


def test_a_branch_deeper_than_the_bucket_is_cut_not_an_error():
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    forward = CudaForward(model, CudaSettings(rows=4))
    engine = Engine(forward, None, _DeepBranches(), max_draft_tokens=9, eos_token_ids=[], draft_policy="tree")
    for prompt in prompts(16, 3, seed=7, repeat=True):
        plain = engine.generate(prompt, GenerationConfig(24, speculate=False))
        drafted = engine.generate(prompt, GenerationConfig(24))
        assert drafted.token_ids == plain.token_ids
        # a pass holds the main chain and the branch's first 4 nodes (2 + 4 draft rows, of 9),
        # fewer where the token limit is near
        stats = drafted.stats
        assert 3 * stats.verify_passes < stats.draft_tokens <= 6 * stats.verify_passes


def test_a_path_longer_than_the_bucket_is_refused_not_written():
    from codespec.index import Draft

    draft = Draft((1, 2, 3, 4, 5, 6), (-1, -1, 1, 2, 3, 4), (1,) * 6, 1, "test")  # a 5-deep second branch
    rows = tree_rows([(0, 10, VerifyTree.build(0, draft))])
    staging = np.zeros(cuda.META_FIELDS * 4 + 16, dtype=np.int64)
    with pytest.raises(AssertionError, match="longer than the bucket"):
        fill_staging(staging, rows, 4, 4)  # rows 4..6: the branch's deep end


def test_prefill_in_replays_is_the_model_and_its_reuse_too():
    """Prompts over several 8-token chunks (prefill as bucket replays), then prompts that
    reuse what is cached: transformers' greedy output."""
    model = tiny_model("qwen2", vocab_size=64, seed=5)
    forward = CudaForward(model, CudaSettings(rows=4))
    cache = SlotCache(model.config, slots=2, slot_tokens=128, dtype=torch.float64, chunk=8)
    engine = Engine(forward, None, eos_token_ids=[], cache=cache)
    base = prompts(64, 1, seed=2, repeat=False)[0] * 2
    for prompt in (base, base + [5, 6, 7, 8, 9, 10, 11, 12, 13], base[:19]):
        generation = engine.generate(prompt, GenerationConfig(max_new_tokens=12, speculate=False))
        assert generation.token_ids == hf_greedy(model, prompt, 12)
    # the last prompt (19 tokens) reused all but its last token: a replayed prefill row is
    # a decode step (Forward.prefill_exact)
    assert generation.stats.cached_prompt_tokens == 18


def test_the_backends_settings_are_read_and_checked(monkeypatch):
    """Every CODESPEC_CUDA_* setting (forward/cuda/settings.py): read by pydantic-settings, a bad
    value a clear error naming it, each described."""
    assert all(field.description for field in CudaSettings.model_fields.values())  # STYLE 7
    monkeypatch.setenv("CODESPEC_CUDA_ROWS", "32")
    monkeypatch.setenv("CODESPEC_CUDA_CHAIN", "0")
    backend = CudaForward(tiny_model("qwen2", vocab_size=16, seed=3))
    assert (backend.rows, backend.chains_steps) == (32, False)
    monkeypatch.setenv("CODESPEC_CUDA_ROWS", "0")
    with pytest.raises(SettingError, match="^CODESPEC_CUDA_ROWS='0': input should be greater than or equal to 1$"):
        CudaForward(tiny_model("qwen2", vocab_size=16, seed=3))  # the environment's bad value, at start-up
    monkeypatch.setenv("CODESPEC_CUDA_ROWS", "")  # empty: the default
    assert CudaSettings().rows == 64


def test_pdl_launches_on_hopper_alone(monkeypatch):
    """`auto` (the default) launches as programmatic dependents on Hopper, never on an
    older GPU or a CPU; `on` on an older GPU is one clear line."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 6))
    assert not launches_pdl("auto", torch.device("cuda"))
    with pytest.raises(SettingError, match=r"^CODESPEC_CUDA_PDL=on .* this one is 8\.6: unset it$"):
        launches_pdl("on", torch.device("cuda"))
    assert not launches_pdl("on", torch.device("cpu"))  # no GPU kernels run there
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    assert launches_pdl("auto", torch.device("cuda")) and not launches_pdl("off", torch.device("cuda"))
    assert CudaForward(tiny_model("qwen2", vocab_size=16, seed=3)).pdl is False  # a CPU model


def test_the_machine_profile_is_keyed_by_every_setting_that_changes_a_pass():
    """The goodput controller's cost curve is stored under the backend's profile key: a
    curve measured with one layout must not price the passes of another."""
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    key = CudaForward(model).profile_key()
    assert CudaForward(model).profile_key() == key  # the same settings: the stored curve serves
    for other in (CudaSettings(rows=32), CudaSettings(compile=False)):
        assert CudaForward(model, other, graphs=True).profile_key() != CudaForward(model, graphs=True).profile_key()
