"""Structured output and predictions on the real default model (bfloat16): every
constrained output parses and validates and equals constrained plain decoding; a
prediction never changes an output."""

from __future__ import annotations

import json

import jsonschema
import pytest

from codespec import prompts
from codespec.engine.engine import Engine, GenerationConfig
from codespec.settings import Settings
from codespec.structured.grammar import Grammar, grammar_tokens
from codespec.structured.tools import Toolbox

pytestmark = pytest.mark.model

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                                           "languages": {"type": "array", "items": {"enum": ["python", "c", "go"]},
                                                         "maxItems": 3}},
          "required": ["name", "age", "languages"], "additionalProperties": False}
ASKS = ["Describe a programmer as JSON.", "Give me a JSON object for Ada Lovelace.",
        "Invent a developer who knows two languages; answer in JSON.", "JSON please: a retired engineer."]


@pytest.fixture(scope="module")
def engine(default_model):
    return Engine.from_settings(default_model.forward, default_model.tokenizer, Settings())


def tokens(engine):
    return grammar_tokens(engine.tokenizer, engine.forward.config.vocab_size, engine.eos_token_ids)


def test_json_schema_output_validates_and_equals_constrained_plain_decoding(engine):
    grammar = Grammar.json_schema(tokens(engine), PERSON)
    drafted = 0
    for ask in ASKS:
        ids = prompts.chat_ids(engine.tokenizer, [{"role": "user", "content": ask}])
        plain = engine.generate(ids, GenerationConfig(160, grammar=grammar, speculate=False))
        spec = engine.generate(ids, GenerationConfig(160, grammar=grammar))
        assert spec.token_ids == plain.token_ids, ask
        assert plain.finish_reason == "stop", plain.text
        jsonschema.validate(json.loads(plain.text), PERSON)
        drafted += spec.stats.draft_tokens
    assert drafted > 0  # speculation ran under the grammar


def test_a_required_tool_call_is_the_same_with_drafts(engine):
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
    box = Toolbox(tools, "required")
    grammar = box.grammar(tokens(engine), prompts.special_id(engine.tokenizer, "<tool_call>"),
                          prompts.special_id(engine.tokenizer, "</tool_call>"))
    ids = prompts.chat_ids(engine.tokenizer, [{"role": "user", "content": "Open setup.py."}], tools)
    plain = engine.generate(ids, GenerationConfig(60, grammar=grammar, speculate=False))
    spec = engine.generate(ids, GenerationConfig(60, grammar=grammar))
    assert spec.token_ids == plain.token_ids
    assert plain.text.startswith("<tool_call>\n{")


def test_a_prediction_keeps_the_output_and_is_accepted(engine):
    code = "def area(width, height):\n    \"\"\"The area.\"\"\"\n    return width * height\n\n\n" \
           "def perimeter(width, height):\n    return 2 * (width + height)\n"
    ask = f"Rename `width` to `w` everywhere. Answer with the code only.\n\n```python\n{code}```"
    ids = prompts.chat_ids(engine.tokenizer, [{"role": "user", "content": ask}])
    plain = engine.generate(ids, GenerationConfig(120, speculate=False))
    for prediction in (code, code.replace("width", "w"), "something else entirely " * 20):
        out = engine.generate(ids, GenerationConfig(120, prediction=tuple(prompts.encode(engine.tokenizer, prediction))))
        assert out.token_ids == plain.token_ids
    right = engine.generate(ids, GenerationConfig(120, prediction=tuple(plain.token_ids)))
    assert right.stats.accepted_by_source.get("prediction", 0) > 0
