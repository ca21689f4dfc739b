"""Benchmark requests built from real Python source that every machine has: the stdlib.

* edit: an agent-style instruction to rename a variable in a function, answered through
  the chat template; the answer copies most of the prompt (copy-heavy).
* fim: an editor-style fill-in-the-middle request: a stdlib module cut after a
  function's docstring, completed with the tokenizer's own FIM tokens.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from codespec.prompts import fim_ids

FIM_PREFIX_TOKENS = 1024  # editor-like budget: ~1k tokens before the cursor,
FIM_SUFFIX_TOKENS = 256  # a quarter of that after it


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int


def edit_workload(tokenizer: Any, max_new_tokens: int = 160) -> Workload:
    source = inspect.getsource(textwrap.TextWrapper._handle_long_word)
    instruction = (
        "Rename the local variable `space_left` to `room` in this method. "
        "Reply with the complete method only.\n\n```python\n" + source + "```"
    )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": instruction}], add_generation_prompt=True, tokenize=False
    )
    return Workload(
        "edit",
        "rename a variable in textwrap.TextWrapper._handle_long_word (chat)",
        tuple(tokenizer(text, add_special_tokens=False)["input_ids"]),
        max_new_tokens,
    )


def fim_workload(tokenizer: Any, max_new_tokens: int = 128) -> Workload:
    module_source = inspect.getsource(textwrap)
    function_source = inspect.getsource(textwrap.dedent)
    body_start = function_source.index('"""', function_source.index('"""') + 3) + 4  # after the docstring line
    cut = module_source.index(function_source) + body_start
    prefix = _keep_tail(tokenizer, module_source[:cut], FIM_PREFIX_TOKENS)
    suffix = _keep_head(tokenizer, module_source[cut:].split("\n\n\n", 1)[-1], FIM_SUFFIX_TOKENS)
    ids = fim_ids(tokenizer, prefix, suffix)
    return Workload("fim", "complete the body of textwrap.dedent in textwrap.py (FIM)", tuple(ids), max_new_tokens)


def _keep_tail(tokenizer: Any, text: str, budget: int) -> str:
    """The longest run of whole trailing lines that fits in `budget` tokens."""
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        used += len(tokenizer(line, add_special_tokens=False)["input_ids"])
        if used > budget:
            break
        kept.append(line)
    return "".join(reversed(kept))


def _keep_head(tokenizer: Any, text: str, budget: int) -> str:
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    used = 0
    for line in lines:
        used += len(tokenizer(line, add_special_tokens=False)["input_ids"])
        if used > budget:
            break
        kept.append(line)
    return "".join(kept)


WORKLOADS: dict[str, Callable[[Any], Workload]] = {"edit": edit_workload, "fim": fim_workload}
