"""Logprobs (verify/logprobs.py): read off the very rows that chose each token, so asking
for them changes no output, speculation changes no value, and each value is the model's
own log-softmax at that position."""

from __future__ import annotations

import pytest
import torch

from codespec.engine.engine import Engine, GenerationConfig
from codespec.verify.logprobs import Committed
from codespec.errors import RequestError
from codespec.forward.select import of_model
from codespec.forward.cuda.forward import CudaForward
from codespec.forward.cuda.settings import CudaSettings
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from tests.test_engine_lossless import prompts


def engine_of(forward) -> Engine:
    return Engine(forward, None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=8, eos_token_ids=[])


@pytest.mark.parametrize("backend", ["transformers", "cuda"])
def test_logprobs_change_nothing_and_speculation_changes_no_value(backend):
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = engine_of(of_model(model) if backend == "transformers" else CudaForward(model, CudaSettings(rows=8)))
    accepted = 0
    for prompt in prompts(16, 4, seed=16, repeat=True):
        plain = engine.generate(prompt, GenerationConfig(max_new_tokens=24, speculate=False))
        for speculate in (False, True):
            out = engine.generate(prompt, GenerationConfig(max_new_tokens=24, speculate=speculate, logprobs=3))
            assert out.token_ids == plain.token_ids
            assert [e.token for e in out.logprobs] == out.token_ids
            if speculate:
                accepted += out.stats.accepted_draft_tokens
                assert out.logprobs == reference  # float64 rows equal their decode steps: the same values
            else:
                reference = out.logprobs
    assert accepted > 0  # drafts were accepted: values came from verify rows, not only steps


def test_values_are_the_models_log_softmax_and_top_is_ordered():
    model = tiny_model("qwen2", vocab_size=32, seed=5)
    engine = engine_of(of_model(model))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    out = engine.generate(prompt, GenerationConfig(max_new_tokens=10, speculate=False, logprobs=4))
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.token_ids[:-1]])).logits[0, len(prompt) - 1:]
    expected = torch.log_softmax(logits.float(), dim=-1)
    for i, entry in enumerate(out.logprobs):
        assert entry.logprob == pytest.approx(float(expected[i, entry.token]), abs=1e-5)
        assert len(entry.top) == 4 and entry.top[0][0] == entry.token  # greedy: the chosen token is the likeliest
        assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)


def test_sampled_tokens_get_their_logprobs():
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = engine_of(of_model(model))
    out = engine.generate([1, 2, 3, 1, 2, 3, 1, 2], GenerationConfig(max_new_tokens=16, temperature=0.8, seed=7,
                                                                    logprobs=0))
    assert [e.token for e in out.logprobs] == out.token_ids and all(e.top == () for e in out.logprobs)
    assert all(e.logprob <= 0.0 for e in out.logprobs)


class Letters:
    """A toy tokenizer: token i is the i-th letter, so text positions are token positions."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def test_a_stop_string_cuts_the_logprobs_with_the_text():
    model = tiny_model("qwen2", vocab_size=26, seed=11)
    engine = Engine(of_model(model), Letters(), eos_token_ids=[])
    prompt = [0, 1, 2]
    free = engine.generate(prompt, GenerationConfig(max_new_tokens=12, speculate=False, logprobs=0))
    stop = free.text[4:6]
    assert len(stop) == 2 and free.text.find(stop) == 4, free.text
    out = engine.generate(prompt, GenerationConfig(max_new_tokens=12, speculate=False, logprobs=0, stop=(stop,)))
    assert out.text == free.text[:4] and len(out.token_ids) > 4  # the stop string's tokens were generated
    assert [e.token for e in out.logprobs] == out.token_ids[:4]


def test_steps_hand_streams_their_logprobs():
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = engine_of(of_model(model))
    run = engine.start([1, 2, 3, 1, 2, 3], GenerationConfig(max_new_tokens=8, logprobs=1))
    pieces = []
    while not run.done:
        kept = engine.advance(run)
        assert isinstance(kept, Committed) and len(kept.logprobs) == len(kept)
        pieces.extend(kept.logprobs)
    assert pieces == run.result().logprobs


def test_out_of_range_alternatives_are_refused():
    with pytest.raises(RequestError, match="logprobs"):
        GenerationConfig(logprobs=21)


def test_a_tie_lists_the_token_greedy_chose_first():
    import torch

    from codespec.verify.logprobs import with_logprobs
    from codespec.verify.tree import VerifyTree

    logits = torch.zeros(1, 8)
    logits[0, 6] = logits[0, 2] = 1.0  # tokens 2 and 6 tie; the first maximum is 2
    result = with_logprobs(None, top=2)(logits, VerifyTree.chain(0))
    assert result.committed == (2,)
    assert [token for token, _ in result.logprobs[0].top] == [2, 6]
