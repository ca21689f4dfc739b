"""Prompts built from the tokenizer's own special tokens (never hard-coded strings).

>>> # fim_ids(tok, "def f(", "):\\n    pass")  -> <|fim_prefix|>def f(<|fim_suffix|>):...<|fim_middle|>
"""

from __future__ import annotations

import functools
import json
import re
import sys
import threading
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from codespec.errors import CodespecError, RequestError

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
REPO_NAME, FILE_SEP = "<|repo_name|>", "<|file_sep|>"


@dataclass(frozen=True)
class ExtraFile:
    """Repository context for a FIM request (llama.cpp's `input_extra` chunks)."""

    filename: str
    text: str


# Every call into a tokenizer holds this lock. Why: transformers' fast tokenizer keeps one
# shared flag for splitting special tokens and sets it on each call (a mutable borrow of
# the Rust object), so two threads at once (a request's prompt, an open buffer for the
# index, the scheduler decoding) either raise "Already borrowed" or tokenize a FIM prompt
# with its markers split. Calls are short; a 5 MB file takes ~1 s.
TOKENIZER_LOCK = threading.RLock()


def encode_texts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Texts (source files, user code, message content) as tokens; the strings of the
    tokenizer's added tokens in them stay plain text, the special ones (`<|endoftext|>`)
    and the others (Qwen2.5's `<tool_call>`) alike, so that no text can end a prompt or
    open a tool call."""
    for text in texts:
        check_unicode(text)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    with TOKENIZER_LOCK:
        if backend is None:  # a slow tokenizer: only its special tokens can be split
            return tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return [e.ids for e in text_tokenizer(backend).encode_batch(texts, add_special_tokens=False)]


@functools.lru_cache(maxsize=8)  # one per tokenizer a process serves
def text_tokenizer(backend: Any) -> Any:
    """A copy of a `tokenizers.Tokenizer` that reads every added token's string as text:
    each is marked special, and special ones are encoded as text. (`split_special_tokens`
    splits only those the tokenizer marks special.)"""
    from tokenizers import Tokenizer

    spec = json.loads(backend.to_str())
    for token in spec.get("added_tokens") or ():
        token["special"] = True
    copy = Tokenizer.from_str(json.dumps(spec))
    copy.encode_special_tokens = True
    return copy


def check_unicode(text: str) -> None:
    """Refuse a lone surrogate (JSON can carry `\\ud800`; no tokenizer can encode it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"the text holds a lone surrogate (U+{ord(text[exc.start]):04X} at character "
                           f"{exc.start}); send valid Unicode") from None


def encode(tokenizer: Any, text: str) -> list[int]:
    return encode_texts(tokenizer, [text])[0]


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """A prompt tokenized verbatim: special tokens written in it (`<|fim_prefix|>`) are
    recognised, as `codespec generate` and /v1/completions promise."""
    check_unicode(text)
    with TOKENIZER_LOCK:  # a list: the Rust tokenizer's batch call lets go of the GIL while it works
        return tokenizer([text], add_special_tokens=False)["input_ids"][0]


def decode(tokenizer: Any, token_ids: Sequence[int]) -> str:
    with TOKENIZER_LOCK:
        return tokenizer.decode(list(token_ids), skip_special_tokens=True)


def special_id(tokenizer: Any, token: str) -> int | None:
    with TOKENIZER_LOCK:
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 and ids[0] != tokenizer.unk_token_id else None


FIM_LAYOUTS = ("psm", "spm")
# the tokens that end a fill-in-the-middle: the model wrote its middle and moves on to
# another part of the prompt's layout (llama.cpp counts them as end-of-generation too)
FIM_END_TOKENS = (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, "<|fim_pad|>", REPO_NAME, FILE_SEP)


@functools.lru_cache(maxsize=8)  # one per tokenizer a process serves: asked by every FIM request
def fim_end_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of the tokenizer's FIM and repository tokens (those it has)."""
    return frozenset(i for token in FIM_END_TOKENS if (i := special_id(tokenizer, token)) is not None)


def fim_ids(
    tokenizer: Any,
    prefix: str,
    suffix: str,
    middle: str = "",
    extra: Sequence[ExtraFile] = (),
    repo_name: str = "",
    prefix_tokens: int | None = None,
    suffix_tokens: int | None = None,
    layout: str = "psm",
    path: str = "",
) -> list[int]:
    """A fill-in-the-middle prompt; with `extra`, the repository-level layout
    (<|repo_name|>, then <|file_sep|>name + text per file, then <|file_sep|>`path` for the
    file being written when a path is given) when the tokenizer has it.
    `prefix_tokens` / `suffix_tokens` keep at most the prefix's last and the suffix's first
    tokens (an editor's budget around the cursor); the prefix is cut on `grid_start`'s
    grid, so that it starts at the same token while the person types.

    `layout`: "psm" (<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>m, the order the model's
    card documents) or "spm", the FIM paper's suffix-prefix-middle variant as StarCoder
    trains it (<|fim_prefix|><|fim_suffix|>S<|fim_middle|>P m: the text after the cursor
    first, the file before it continuing after the middle token). A person writing line
    after line above the same text then changes only the prompt's end, and the KV cache
    keeps the rest (lsp/window.py); on the typing replay it also doubled first-line
    matches (docs/decisions.md). Not llama.cpp's `--spm-infill` order
    (<|fim_suffix|>S<|fim_prefix|>P<|fim_middle|>): the default model fails at it."""
    if layout not in FIM_LAYOUTS:
        raise RequestError(f"unknown fill-in-the-middle layout {layout!r}; use one of {', '.join(FIM_LAYOUTS)}")
    fim = [special_id(tokenizer, t) for t in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)]
    if any(t is None for t in fim):
        raise RequestError("this model's tokenizer has no fill-in-the-middle tokens; use a prompt without a suffix")
    ids: list[int] = []
    repo, sep = special_id(tokenizer, REPO_NAME), special_id(tokenizer, FILE_SEP)
    if extra and repo is not None and sep is not None:
        ids += [repo, *encode(tokenizer, f"{repo_name or 'repository'}\n")]
        for chunk in extra:
            ids += [sep, *encode(tokenizer, f"{chunk.filename}\n{chunk.text}")]
        if path:
            ids += [sep, *encode(tokenizer, f"{path}\n")]
    elif extra:  # no repository tokens: the extra files become a commented preamble
        prefix = "".join(f"# {c.filename}\n{c.text}\n" for c in extra) + prefix
    before, after = encode(tokenizer, prefix), encode(tokenizer, suffix)
    if prefix_tokens is not None:
        before = before[grid_start(len(before), prefix_tokens) :]
    if suffix_tokens is not None:
        after = after[:suffix_tokens]
    if layout == "spm":
        ids += [fim[0], fim[1], *after, fim[2], *before]
    else:
        ids += [fim[0], *before, fim[1], *after, fim[2]]
    return ids + encode(tokenizer, middle)


def chat_ids(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """A chat prompt in which only the template's own markers are control tokens.

    Message text is content: `<|im_end|>` or `<|file_sep|>` written by a user or returned
    by a tool stays plain text, so it cannot close its turn and open a system one.
    The template is rendered around placeholders; the text between two of its
    special tokens (its own words and the contents within) is tokenized with special
    tokens split. A fast tokenizer splits at special tokens before anything else, so for
    content without marker strings the ids equal `apply_chat_template(tokenize=True)`'s.
    A `developer` message (OpenAI's newer name for system instructions) is a system one.
    `tools` (OpenAI's function tools) and an assistant's `tool_calls` are the template's
    to write; its tool markers (Qwen2.5's `<tool_call>`) are tokens, as the model writes them.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise RequestError("this model has no chat template; use /v1/completions")
    nonce = uuid.uuid4().hex
    contents = [m.get("content") or "" for m in messages]
    shown = [{**m, "role": "system" if m.get("role") == "developer" else m.get("role"),
              "content": f"\x1f{nonce}:{i}\x1f" if text else ""} for i, (m, text) in enumerate(zip(messages, contents))]
    with TOKENIZER_LOCK:
        rendered = tokenizer.apply_chat_template(shown, add_generation_prompt=True, tokenize=False,
                                                 **({"tools": tools} if tools else {}))
    placeholder = re.compile(f"\x1f{nonce}:(\\d+)\x1f")
    missing = [m.get("role") for i, m in enumerate(messages) if contents[i] and f"{nonce}:{i}\x1f" not in rendered]
    if missing:
        raise RequestError(f"this model's chat template drops {missing[0]} messages; send them as user or system")
    ids: list[int] = []
    for part in _split_specials(tokenizer, rendered):
        if isinstance(part, int):
            ids.append(part)
        elif part:
            ids += encode(tokenizer, placeholder.sub(lambda found: contents[int(found.group(1))], part))
    return ids


def _split_specials(tokenizer: Any, text: str) -> list[str | int]:
    """`text` cut at the tokenizer's added tokens (`<|im_end|>`, `<tool_call>`): text,
    id, text, ... (markers as ids)."""
    specials = {t.content: i for i, t in tokenizer.added_tokens_decoder.items()}
    if not specials:
        return [text]
    pattern = re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))
    parts: list[str | int] = []
    start = 0
    for marker in pattern.finditer(text):
        parts += [text[start:marker.start()], specials[marker.group()]]
        start = marker.end()
    return parts + [text[start:]]


GRID_PARTS = 4  # a window's start moves in steps of budget / GRID_PARTS


def grid_start(length: int, budget: int) -> int:
    """Where a window of at most `budget` units over `length` units starts: 0 while all
    fits, else the first multiple of budget // GRID_PARTS that leaves at most `budget`.
    While the text grows at its end (a person typing), the start stays put for a quarter
    of the budget, so consecutive prompts share their leading tokens (the KV cache).

    >>> [grid_start(n, 100) for n in (80, 100, 101, 124, 125, 126, 150)]
    [0, 0, 25, 25, 25, 50, 50]
    """
    if length <= budget:
        return 0
    step = max(budget // GRID_PARTS, 1)
    return -(-(length - budget) // step) * step


ANCHOR_EVERY = 32  # one line in this many, by content, may start a client's long prefix
ANCHOR_MIN_LINES = 200  # prefixes this long are likely a client's sliding window (llama.vim: 256)


def anchored_prefix(prefix: str, every: int = ANCHOR_EVERY, min_lines: int = ANCHOR_MIN_LINES) -> str:
    r"""`prefix` from its first anchor line on: a non-blank line whose CRC-32 is a multiple
    of `every` among its first 4 * `every` lines; unchanged when shorter than `min_lines`
    lines or without such a line.

    Why: llama.vim sends the 256 lines before the cursor, so past line 256 every new line
    moves the prompt's start by one line and the whole prefix is read again (~2,000
    tokens, ~4 s on a 2-core CPU). The first anchor in the window stays the first while
    the window slides over it, ~every lines on average, so consecutive prompts share
    their start and the KV cache keeps it. A pure function of the text: the same request
    gets the same prompt, whatever came before.

    >>> lines = [f"x{i} = {i}\n" for i in range(300)]
    >>> a, b = anchored_prefix("".join(lines[0:256])), anchored_prefix("".join(lines[1:257]))
    >>> a.split("\n", 1)[0] == b.split("\n", 1)[0] != "x0 = 0"   # the same start, a few lines in
    True
    >>> anchored_prefix("".join(lines[:150])) == "".join(lines[:150])   # short: as given
    True
    """
    lines = prefix.splitlines(keepends=True)
    if len(lines) < min_lines:
        return prefix
    for i, line in enumerate(lines[: 4 * every]):
        text = line.strip()
        if text and zlib.crc32(text.encode()) % every == 0:
            return "".join(lines[i:])
    return prefix


MAX_PROMPT_BYTES = 8 << 20  # a prompt larger than this is a mistake, not a request


def read_prompt(source: str, what: str = "prompt") -> str:
    """The prompt's text (or another input file's, named `what`); binary, non-UTF-8 or
    oversized input is refused with a clear line."""
    if source == "-":
        if sys.stdin.isatty():
            raise CodespecError("no prompt: give PROMPT_FILE or pipe the prompt into stdin")
        data = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)
        name = "stdin"
    else:
        path = Path(source)
        if not path.is_file():
            raise CodespecError(f"{what} file {source}: no such file")
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPT_BYTES + 1)
        name = source
    if len(data) > MAX_PROMPT_BYTES:
        raise RequestError(f"{what} {name} is larger than {MAX_PROMPT_BYTES >> 20} MiB")
    if b"\x00" in data:
        raise RequestError(f"{what} {name} looks binary (it contains NUL bytes); give a text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"{what} {name} is not UTF-8 text (bad byte at offset {exc.start})") from None
    if not text:
        raise RequestError(f"{what} {name} is empty")
    return text
