"""Grammars a request's output must follow, compiled by llguidance.

llguidance (docs/decisions.md: chosen over xgrammar and outlines-core) reads the
model's `tokenizer.json` itself, compiles a JSON schema in well under a millisecond and
computes a token mask in tens of microseconds: a few per verify pass, against a pass of
15 ms or more. A `Grammar` is compiled and checked when the request arrives (a schema it
cannot serve is a 400 naming the field); each run gets its own `GrammarMatcher`, the
`Constraint` that verify/grammar.py masks rows with.

    grammar = Grammar.json_schema(tokens, {"type": "object"})
    matcher = grammar.start()               # one request's state
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Sequence

import numpy as np

from codespec.errors import RequestError

# JSON's whitespace between tokens, at most this many characters in a row: a model may
# indent as it likes, but cannot spend its tokens on blank space
WHITESPACE = r"[\x20\x0A\x0D\x09]{1,48}"
JSON_OPTIONS = {"whitespace_pattern": WHITESPACE}


class GrammarError(RequestError):
    """A grammar (a JSON schema, a tool's parameters) that cannot be served."""


@functools.lru_cache(maxsize=4)  # one per tokenizer a process serves: building it takes ~0.9 s
def _tokens(tokenizer_json: str, vocab: int, eos: tuple[int, ...]) -> Any:
    import llguidance

    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=list(eos))


def grammar_tokens(tokenizer: Any, vocab: int, eos: Iterable[int]) -> Any:
    """llguidance's view of `tokenizer` (a fast tokenizer or forward/tokenizer.py's), with
    `vocab` mask entries (the model's, which may exceed the tokenizer's) and the tokens
    that end the output."""
    return _tokens(_tokenizer_json(tokenizer), vocab, tuple(sorted(eos)))


@functools.lru_cache(maxsize=4)
def _tokenizer_json_of(backend: Any) -> str:
    return backend.to_str()


def _tokenizer_json(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise GrammarError("structured output needs a fast tokenizer (tokenizer.json); this model has none")
    return _tokenizer_json_of(backend)


class Grammar:
    """A compiled, checked grammar (llguidance's JSON form of it) over one tokenizer."""

    def __init__(self, tokens: Any, source: str, field: str) -> None:
        import llguidance

        error = llguidance.LLMatcher.validate_grammar(source, tokens)
        if error:
            raise GrammarError(f"{field}: the grammar engine cannot compile it: {error.splitlines()[0]}")
        self.tokens, self.source = tokens, source

    @classmethod
    def json_schema(cls, tokens: Any, schema: dict[str, Any], field: str = "response_format") -> Grammar:
        """Output that is one JSON value valid under `schema` (checked as a JSON schema first)."""
        import llguidance

        check_schema(schema, field)
        try:
            source = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise GrammarError(f"{field}: {exc}") from exc
        return cls(tokens, source, field)

    @classmethod
    def lark(cls, tokens: Any, lark: str, field: str) -> Grammar:
        import llguidance

        return cls(tokens, llguidance.LLMatcher.grammar_from_lark(lark), field)

    def start(self) -> GrammarMatcher:
        return GrammarMatcher(self)


class GrammarMatcher:
    """One request's place in its grammar (verify/grammar.py's `Constraint`)."""

    def __init__(self, grammar: Grammar) -> None:
        import llguidance

        self._matcher = llguidance.LLMatcher(grammar.tokens, grammar.source, log_level=0)
        self._vocab = grammar.tokens.vocab_size
        if self._matcher.is_error():
            raise GrammarError(self._matcher.get_error())

    def allowed(self) -> np.ndarray:
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self._vocab].astype(bool)

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(int(token)):
            raise RequestError(f"the output left its grammar: {self.describe()}")

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        return self._matcher.validate_tokens([int(t) for t in tokens])

    def describe(self) -> str:
        error = self._matcher.get_error()
        return error.splitlines()[0] if error else f"the grammar stopped ({self._matcher.stop_reason()})"


def check_schema(schema: Any, field: str) -> None:
    """A 400 naming `field` for what is not a JSON schema (jsonschema's metaschema check)."""
    import jsonschema

    if not isinstance(schema, dict):
        raise GrammarError(f"{field}: a JSON schema is an object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise GrammarError(f"{field}: not a valid JSON schema: {exc.message}") from exc


def validation_error(schema: dict[str, Any], value: Any) -> str | None:
    """Why `value` does not follow `schema` (None: it does)."""
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    return None if error is None else error.message
