"""llama.vim's own requests against `/infill`, as its code builds them
(autoload/llama.vim: `llama#fim` and the ring-buffer update), on the default model: the
warm-up with `n_predict` 0, the first request with its 250 ms limit and a later one
with 1000 ms, each answer carrying every field llama.vim reads, a multi-token suggestion
within its default limits, and no extra space after a prompt that ends in one."""

from __future__ import annotations

import json

import pytest

from codespec import prompts
from codespec.bench.editor import (
    LLAMA_VIM_FIELDS,
    SAMPLE_FILE,
    infill_body,
    warmup_body,
)
from codespec.bench.typing import Ask
from codespec.engine.run import GenerationConfig
from codespec.landing.cut import Landing
from codespec.landing.syntax import Mode

pytestmark = [pytest.mark.model, pytest.mark.anyio]

SOURCE = SAMPLE_FILE + '''def count_lines(path):
    """The number of lines of the file at path."""
    with open(path, encoding="utf-8") as f:
        
'''
EXTRA = [{"filename": "util.py", "text": "def is_python(name):\n    return name.endswith('.py')\n"},
         {"filename": "numbers.py",  # past one prefill chunk (256 tokens): the prompt cache keeps whole chunks
          "text": "".join(f"def add_{i}(x):\n    return x + {i}\n\n" for i in range(30))}]


def ask_at(text: str, line: int, character: int) -> Ask:
    offset = sum(len(x) + 1 for x in text.split("\n")[:line]) + character
    return Ask(path="lines.py", text=text, offset=offset, truth="", kind="line-start")


def greedy(backend, prefix: str, suffix: str, middle: str, n: int) -> str:
    ids = prompts.fim_ids(backend.tokenizer, prefix, suffix, middle, layout=backend.settings.infill_layout)
    return backend.engine.generate(ids, GenerationConfig(max_new_tokens=n, speculate=False)).text


async def test_llama_vim_warm_up_first_and_later_requests(http):
    warm = await http.post("/infill", json=warmup_body(EXTRA))
    assert warm.status_code == 200 and warm.json() == {}  # response_fields [""]: nothing asked for
    line = SOURCE.split("\n").index("        ")
    for first in (True, False):
        body = {**infill_body(ask_at(SOURCE, line, 8), first), "input_extra": EXTRA}
        assert body["prompt"] == "" and body["n_indent"] == 8  # llama.vim empties a blank middle
        out = (await http.post("/infill", json=body)).json()
        assert set(out) == set(LLAMA_VIM_FIELDS), out  # every field llama.vim reads, flat
        content = out["content"]
        assert out["timings/predicted_n"] >= 2 and content.strip(), out  # a multi-token suggestion
        # n_indent 8: no line after the first is indented less
        assert all(not x.strip() or len(x) - len(x.lstrip()) >= 8 for x in content.split("\n")[1:]), content
    assert out["tokens_cached"] > 0  # the later request reused the first one's prompt


async def test_a_prompt_ending_in_a_space_gets_no_extra_space(http, backend):
    prefix = "def area(width, height):\n"
    suffix = "\n\nprint(area(2, 3))\n"
    body = {"input_prefix": prefix, "input_suffix": suffix, "prompt": "    return ", "n_predict": 8}
    content = (await http.post("/infill", json=body)).json()["content"]
    # the model was asked without the trailing space and wrote it itself; the content
    # starts after it
    raw = greedy(backend, prefix, suffix, "    return", 8)
    # ... and it is cut where it lands: the line, not the `print` below the function
    landing = Landing.at(prefix + "    return " + suffix, len(prefix) + 11, "", Mode.MULTI)
    assert raw.startswith(" ") and content == landing.trim(raw[1:]) and content.strip(), (raw, content)
    stream = await http.post("/infill", json={**body, "stream": True})
    pieces = [line for line in stream.text.splitlines() if line.startswith("data: ")]
    assert "".join(json.loads(p[len("data: "):])["content"] for p in pieces) == content


async def test_n_indent_stops_a_stream_and_a_response_at_the_same_place(http, backend):
    body = {"input_prefix": "class Box:\n    def __init__(self, w):\n", "input_suffix": "",
            "prompt": "        self.w = w", "n_predict": 64, "n_indent": 8}
    whole = (await http.post("/infill", json=body)).json()
    lines = whole["content"].split("\n")
    assert all(not x.strip() or len(x) - len(x.lstrip()) >= 8 for x in lines[1:]), whole["content"]
    # speculation does not move the cut: plain decoding with the same rule ends at the same place
    ids = prompts.fim_ids(backend.tokenizer, body["input_prefix"], "", body["prompt"],
                          layout=backend.settings.infill_layout)
    document = body["input_prefix"] + body["prompt"]
    landing = Landing.at(document, len(document), "", Mode.MULTI)
    plain = backend.engine.generate(ids, GenerationConfig(max_new_tokens=64, speculate=False, min_indent=8,
                                                          end_at=landing.end,
                                                          end_ids=prompts.fim_end_ids(backend.tokenizer)))
    assert whole["content"] == landing.trim(plain.text)
    stream = await http.post("/infill", json={**body, "stream": True})
    pieces = [json.loads(x[len("data: "):]) for x in stream.text.splitlines() if x.startswith("data: ")]
    assert "".join(p["content"] for p in pieces) == whole["content"]
