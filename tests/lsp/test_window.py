"""The prompt window stays put while a person types: consecutive requests of
the typing replay share everything before the cursor's line, as tokens, so the KV prefix
cache can reuse it; the old window (the last N characters before the cursor) shared
nothing in a file longer than N."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from codespec.bench.typing import typing_replay
from codespec.lsp.options import LspOptions
from codespec.landing.lines import HeldSpace
from codespec.lsp.window import fim_request, prefix_window
from codespec.prompts import fim_ids


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.lsp.tiny_fim import tiny_fim_model

    return AutoTokenizer.from_pretrained(tiny_fim_model(tmp_path_factory.mktemp("tiny")))


def prompt(tokenizer, ask, options):
    request, _ = fim_request(ask.text, ask.offset, options)
    return fim_ids(tokenizer, request.prefix, request.suffix, request.middle, prefix_tokens=request.prefix_tokens,
                   suffix_tokens=request.suffix_tokens, layout=request.layout)


def shared(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_typing_keeps_the_prompt_start_in_a_long_file(tokenizer):
    # a byte-level tokenizer: one token a character, so the token window holds 2k characters
    options = LspOptions(prefix_tokens=2048, suffix_tokens=64)
    asks = [a for a in typing_replay().asks if a.path == "statistics.py"]  # ~47k characters: longer than the window
    assert len(asks) >= 16 and len(asks[0].text) > 4 * options.prefix_tokens
    prompts = [prompt(tokenizer, a, options) for a in asks]
    kept = [round(shared(p, q) / len(q), 2) for p, q in zip(prompts, prompts[1:])]
    # the person types a line (or half of one) between requests: the prompts share their
    # windows up to the edited line; a grid step (every quarter window, ~12 lines here) may
    # move the start (here twice in ~20 lines), and the second function is 120 lines further
    assert sum(k > 0.6 for k in kept) >= len(kept) - 3, kept
    assert all(len(p) <= options.prefix_tokens + options.suffix_tokens + 64 for p in prompts)


def test_typing_along_a_line_changes_only_the_middle(tokenizer):
    options = LspOptions()
    head, tail = "def f(x):\n    return x\n\n\ndef g(y):\n", "\n    return total\n"
    empty, typed = head + "    " + tail, head + "    total = y" + tail
    before = prompt(tokenizer, SimpleNamespace(text=empty, offset=len(head) + 4), options)
    after = prompt(tokenizer, SimpleNamespace(text=typed, offset=len(head) + len("    total = y")), options)
    assert before == after[: len(before)]  # the typed text went after the FIM middle token: nothing before moved


def test_with_the_suffix_first_a_new_line_changes_only_the_prompt_end(tokenizer):
    """The `spm` layout: the person writes line after line above the same text, and each
    line-start request shares its prompt with the one before up to the line written; in
    `psm` the suffix after the cursor follows that line, so all of it is read again."""
    asks = [a for a in typing_replay().asks if a.path == "colorsys.py" and a.kind == "line-start"][:8]
    for layout, least in (("spm", 0.9), ("psm", 0.0)):
        options = LspOptions(fim_layout=layout, prefix_tokens=4096, suffix_tokens=256)
        prompts = [prompt(tokenizer, a, options) for a in asks]
        kept = [shared(p, q) / len(q) for p, q in zip(prompts, prompts[1:])]
        written = [len(q) - shared(p, q) for p, q in zip(prompts, prompts[1:])]
        if layout == "spm":
            assert min(kept) > least and max(written) < 80, (kept, written)
        else:
            assert min(written) > 256, written  # the suffix and the line: read again each time


def test_trailing_spaces_are_held_back_and_written_by_the_model():
    middle, held = HeldSpace.split("    x = ")
    assert middle == "    x =" and held.text == " "
    assert held.heal(" 1\n") == "1\n" and held.heal("") == "" and held.heal("\n") is None


def test_the_window_starts_at_a_line_on_the_grid():
    text = "".join(f"value_{i} = {i}\n" for i in range(400))
    window = prefix_window(text, 1000)
    assert window.startswith("value_") and 750 <= len(window) <= 1000
    for typed in ("v", "value_400 = 4", "value_400 = 400\nvalue_401"):
        assert prefix_window(text + typed, 1000).startswith(window[:200])


def test_default_logs_carry_no_protocol_messages():
    import logging

    from codespec.cli.lsp import configure_logging

    configure_logging("info")
    assert not logging.getLogger("pygls.protocol.json_rpc").isEnabledFor(logging.INFO)  # "Sending data: {...}"
    assert logging.getLogger("codespec.lsp").isEnabledFor(logging.INFO)
    configure_logging("debug")
    assert logging.getLogger("pygls.protocol.json_rpc").isEnabledFor(logging.DEBUG)
    configure_logging("info")
