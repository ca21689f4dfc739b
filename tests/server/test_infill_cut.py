"""/infill and /v1/completions with a suffix serve a fill-in-the-middle cut for where it
lands (landing/cut.py), on the default model: llama.cpp's own server-test requests, the
cut's stop lossless against plain decoding under the same rule, streamed and not; what
the model writes that is only whitespace is not served; n_predict -1 is bounded; an
`input_extra` item without text is refused."""

from __future__ import annotations

import json

import pytest

from codespec import prompts
from codespec.engine.run import Generation, GenerationConfig
from codespec.engine.stats import GenerationStats
from codespec.landing.cut import Landing, infill_mode

pytestmark = [pytest.mark.model, pytest.mark.anyio]

# llama.cpp's tools/server/tests/unit/test_infill.py, `test_infill_with_input_extra`
LLAMA_INFILL = {"input_extra": [{"filename": "llama.h", "text": "LLAMA_API int32_t llama_n_threads();\n"}],
                "input_prefix": "#include <cstdio>\n#include \"llama.h\"\n\nint main() {\n",
                "prompt": "    int n_threads = llama_", "input_suffix": "}\n", "n_predict": 64}


def streamed(response) -> tuple[str, list[dict]]:
    events = [json.loads(x[len("data: "):]) for x in response.text.splitlines() if x.startswith("data: ")]
    return "".join(e.get("content", "") for e in events), events


async def test_infill_stops_where_it_meets_the_suffix_and_equals_plain_decoding(http, backend):
    out = (await http.post("/infill", json=LLAMA_INFILL)).json()
    content = out["content"]
    assert content.strip() and "}" not in content.split("\n") and "```" not in content, content
    text, events = streamed(await http.post("/infill", json={**LLAMA_INFILL, "stream": True}))
    assert text == content and events[-1]["stop"] is True
    # speculation does not move the cut: plain decoding under the same rule ends at the same token
    document = LLAMA_INFILL["input_prefix"] + LLAMA_INFILL["prompt"] + LLAMA_INFILL["input_suffix"]
    cursor = len(LLAMA_INFILL["input_prefix"] + LLAMA_INFILL["prompt"])
    landing = Landing.at(document, cursor, "", infill_mode(document, cursor))
    ids = prompts.fim_ids(backend.tokenizer, LLAMA_INFILL["input_prefix"], LLAMA_INFILL["input_suffix"],
                          LLAMA_INFILL["prompt"], [prompts.ExtraFile("llama.h", LLAMA_INFILL["input_extra"][0]["text"])],
                          layout=backend.settings.infill_layout)
    config = GenerationConfig(max_new_tokens=64, speculate=False, end_at=landing.end,
                              end_ids=prompts.fim_end_ids(backend.tokenizer))
    plain = backend.engine.generate(ids, config)
    assert content == landing.trim(plain.text) and out["tokens_predicted"] == plain.stats.generated_tokens


async def test_completions_with_a_suffix_stop_where_they_meet_it(http):
    body = {"prompt": LLAMA_INFILL["input_prefix"] + LLAMA_INFILL["prompt"], "suffix": LLAMA_INFILL["input_suffix"],
            "max_tokens": 64}
    text = (await http.post("/v1/completions", json=body)).json()["choices"][0]["text"]
    assert "}" not in text.split("\n") and "```" not in text, text


@pytest.mark.parametrize("extra", [{}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"},
                                   {"filename": 123, "text": 456}])
async def test_an_extra_chunk_without_text_is_refused(http, extra):
    # llama.cpp's `test_invalid_input_extra_req`
    r = await http.post("/infill", json={"input_prefix": "x", "input_suffix": "", "input_extra": [extra]})
    assert r.status_code == 400 and "input_extra" in r.json()["error"]["message"], r.text


def scripted(backend, monkeypatch, text: str, seen: list[GenerationConfig]) -> None:
    """The backend's generation replaced by one that writes `text` (as whole tokens)."""
    async def generate(prompt_ids, config):
        seen.append(config)
        ids = prompts.encode(backend.tokenizer, text)
        yield ids
        yield Generation(ids, text, "stop", GenerationStats(prompt_tokens=len(prompt_ids), generated_tokens=len(ids)))

    monkeypatch.setattr(backend, "generate", generate)


async def test_whitespace_only_content_is_not_served(http, backend, monkeypatch):
    seen: list[GenerationConfig] = []
    scripted(backend, monkeypatch, "    \n   ", seen)
    body = {"input_prefix": "def f():\n", "prompt": "    ", "input_suffix": "\n", "n_predict": 8}
    assert (await http.post("/infill", json=body)).json()["content"] == ""
    text, _ = streamed(await http.post("/infill", json={**body, "stream": True}))
    assert text == ""


async def test_unbounded_n_predict_gets_the_servers_bound(http, backend, monkeypatch):
    seen: list[GenerationConfig] = []
    scripted(backend, monkeypatch, "x = 1", seen)
    r = await http.post("/infill", json={"input_prefix": "", "prompt": "", "input_suffix": "", "n_predict": -1})
    assert r.status_code == 200 and seen[-1].max_new_tokens == backend.settings.infill_max_tokens
