"""The vLLM `custom_class` proposer against vLLM's call contract, without vLLM: numpy
arrays shaped like the model runner's (`token_ids_cpu[max_num_reqs, max_model_len]`,
`num_tokens_no_spec[max_num_reqs]`, one list of sampled ids per row)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from codespec.errors import CodespecError
from codespec.index import IndexFileError, SuffixIndex
from codespec.integrations.vllm import INDEX_ENV, CodespecProposer

MAX_LEN = 64


def config(k: int = 8, min_match: int | None = None, max_len: int = MAX_LEN) -> SimpleNamespace:
    spec = SimpleNamespace(num_speculative_tokens=k, prompt_lookup_min=min_match, model="x.CodespecProposer")
    return SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(max_model_len=max_len, tokenizer=None))


class Batch:
    """The runner's persistent batch: rows of committed tokens."""

    def __init__(self, rows: int = 4) -> None:
        self.tokens = np.zeros((rows, MAX_LEN), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int32)

    def set(self, row: int, ids: list[int]) -> None:
        self.tokens[row, : len(ids)] = ids
        self.lengths[row] = len(ids)

    def step(self, proposer: CodespecProposer, sampled: list[list[int]]) -> list[list[int]]:
        return proposer.propose(sampled, self.lengths, self.tokens, slot_mappings=None)


def test_k_tokens_for_a_k_token_match_from_the_request_itself():
    batch, p = Batch(), CodespecProposer(config())
    batch.set(0, [5, 6, 7, 8, 9, 1, 2, 5, 6])  # [5, 6] matched: 2 tokens
    batch.set(1, [1, 2, 3, 4, 1, 2, 3])  # [1, 2, 3] matched: 3 tokens (4 1 2)
    drafts = batch.step(p, [[6], [3]])
    assert drafts == [[7, 8], [4, 1, 2]]


def test_nothing_for_prefilling_rows_short_matches_or_a_full_context():
    batch, p = Batch(), CodespecProposer(config(min_match=3))
    batch.set(0, [5, 6, 7, 5, 6])  # a 2-token match is below prompt_lookup_min=3
    batch.set(1, [1, 2, 3, 1, 2, 3])
    batch.set(2, list(range(1, MAX_LEN)) + [1])  # one token from the model's limit: no room
    assert batch.step(p, [[6], [], [1]]) == [[], [], []]  # row 1 still prefills (sampled nothing)


def test_drafts_are_capped_by_k_and_the_room_left():
    batch, p = Batch(), CodespecProposer(config(k=4))
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    batch.set(0, ids + ids[:8])  # an 8-token match
    assert batch.step(p, [[ids[7]]]) == [ids[8:12]]
    tight = Batch()
    near_end = list(range(100, 139)) + ids + ids[:8]  # 61 tokens: 3 left, one is the bonus
    tight.set(0, near_end)
    assert tight.step(CodespecProposer(config(k=16)), [[near_end[-1]]]) == [ids[8:10]]


def test_sessions_follow_rows_across_steps_and_moves():
    batch, p = Batch(), CodespecProposer(config())
    a = [10, 11, 12, 13, 14, 10, 11]
    b = [20, 21, 22, 23, 20, 21]
    batch.set(0, a)
    batch.set(1, b)
    assert batch.step(p, [[11], [21]]) == [[12, 13], [22, 23]]
    first_a = p.rows[0].session
    # a finished; the runner condenses the batch: b moves to row 0 and grows by 2
    batch.set(0, b + [22, 23])
    batch.lengths[1] = 0
    drafts = batch.step(p, [[22, 23]])
    assert drafts == [[20, 21, 22, 23]]  # the 4-token match [20 21 22 23] ... continued
    assert p.rows[0].session is not first_a and len(p.rows) == 1


def test_a_finished_request_joins_the_index_as_a_past_generation(tmp_path):
    path = tmp_path / "repo.csidx"
    SuffixIndex.build({"a.py": [1, 2, 3]}).save(path)
    batch, p = Batch(), CodespecProposer(config(), index_path=str(path))
    prompt = [40, 41, 42]
    batch.set(0, prompt + [43])
    batch.step(p, [[43]])
    batch.set(0, prompt + [43, 44, 45])
    batch.step(p, [[44, 45]])
    batch.set(0, [90, 91])  # another request took the row: the first one finished
    batch.step(p, [[91]])
    batch.set(1, [7, 43, 44])  # a later request drafts from that output
    assert batch.step(p, [[91], [44]])[1] == [45]


def test_an_index_file_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "repo.csidx"
    SuffixIndex.build({"a.py": [1, 2, 3, 4, 5, 6]}).save(path)
    monkeypatch.setenv(INDEX_ENV, str(path))
    batch, p = Batch(), CodespecProposer(config())
    batch.set(0, [9, 2, 3, 4])  # [2, 3, 4] is in a.py: 3 tokens follow
    assert batch.step(p, [[4]]) == [[5, 6]]


def test_a_missing_or_corrupt_index_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(INDEX_ENV, str(tmp_path / "nope.csidx"))
    with pytest.raises(CodespecError, match="no such file"):
        CodespecProposer(config())
    bad = tmp_path / "bad.csidx"
    bad.write_bytes(b"not an index")
    monkeypatch.setenv(INDEX_ENV, str(bad))
    with pytest.raises(IndexFileError):
        CodespecProposer(config())
