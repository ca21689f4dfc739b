from __future__ import annotations

import pytest

from codespec.errors import RequestError
from codespec.engine.stopping import StopCondition

# A toy tokenizer: token i decodes to the i-th letter, so text positions equal tokens.
def decode(ids):
    return "".join(chr(ord("a") + i) for i in ids)


def test_eos_inside_a_multi_token_commit_cuts_there():
    stop = StopCondition(eos_ids={9}, max_new_tokens=100)
    assert stop.admit([], [1, 2, 9, 3]) == ([1, 2], "stop")


def test_limit_inside_a_multi_token_commit_cuts_there():
    stop = StopCondition(eos_ids=set(), max_new_tokens=4)
    assert stop.admit([1, 2], [3, 4, 5]) == ([3, 4], "length")


def test_stop_string_keeps_the_fewest_tokens_that_complete_it_and_cuts_text():
    stop = StopCondition(eos_ids=set(), max_new_tokens=100, stop=("cd",), decode=decode)
    kept, reason = stop.admit([0, 1], [2, 3, 4, 5])  # "ab" + "cdef"
    assert (kept, reason) == ([2, 3], "stop")
    assert stop.text_end == 2  # output text "ab"


def test_stop_string_spanning_two_commits():
    stop = StopCondition(eos_ids=set(), max_new_tokens=100, stop=("cd",), decode=decode)
    assert stop.admit([0], [1, 2]) == ([1, 2], None)  # "abc": no stop yet
    assert stop.admit([0, 1, 2], [3, 4]) == ([3], "stop")
    assert stop.text_end == 2


@pytest.mark.parametrize("kwargs", [dict(max_new_tokens=0), dict(max_new_tokens=5, stop=("",), decode=decode),
                                    dict(max_new_tokens=5, stop=("x",))])
def test_bad_conditions_are_refused(kwargs):
    with pytest.raises(RequestError):
        StopCondition(eos_ids=set(), **kwargs)


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode_chars(ids) -> str:
    return "".join(map(chr, ids))


def test_n_indent_ends_at_the_first_line_indented_less():
    # llama.cpp's n_indent: the first line is free; later, a non-blank line indented less
    # than 4 ends it, cut before its first character (its indentation stays)
    stop = StopCondition(eos_ids=set(), max_new_tokens=100, decode=decode_chars, min_indent=4)
    text = "x = 1\n    y = 2\n\n  z = 3\n"
    assert stop.admit([], chars(text[:8])) == (chars(text[:8]), None)  # "x = 1\n  ": not known yet
    kept, reason = stop.admit(chars(text[:8]), chars(text[8:]))
    assert reason == "stop" and decode_chars(chars(text[:8]) + kept) == "x = 1\n    y = 2\n\n  z"
    assert stop.text_end == len("x = 1\n    y = 2\n\n  ")


def test_n_indent_zero_and_a_first_line_never_stop():
    assert StopCondition(eos_ids=set(), max_new_tokens=100, decode=decode_chars).admit(
        [], chars("a\nb\n")) == (chars("a\nb\n"), None)
    stop = StopCondition(eos_ids=set(), max_new_tokens=100, decode=decode_chars, min_indent=8)
    assert stop.admit([], chars("return x")) == (chars("return x"), None)


def test_a_stream_never_shows_the_line_that_n_indent_cuts():
    from codespec.engine.textstream import TextStream

    stream = TextStream(decode_chars, min_indent=4)
    assert stream.push(chars("a = 1\n    b")) == "a = 1\n    b"
    assert stream.push(chars("\n  c = 2")) == "\n  "  # the run ends at "c": never shown
    assert stream.finish("a = 1\n    b\n  ") == ""


def test_incremental_text_decodes_new_tokens_alone_and_waits_for_whole_characters():
    """Tokens as UTF-8 bytes (a byte-level BPE's worst case: every multi-byte character
    split across tokens): pushed in random runs, the pieces join to the whole text, no
    piece holds a half character, and no push decodes the tokens before its window."""
    import random

    from codespec.engine.textstream import REPLACEMENT, IncrementalText

    source = "def f(x):  # héllo wörld 😀 中文 🧑‍💻\n    return x\n"
    ids = list(source.encode("utf-8"))
    rng = random.Random(1)
    for _ in range(50):
        decoded = []

        def decode(tokens):
            decoded.append(len(tokens))
            return bytes(tokens).decode("utf-8", errors="replace")

        text, pieces, at = IncrementalText(decode), [], 0
        while at < len(ids):
            step = rng.randint(1, 5)
            pieces.append(text.push(ids[at:at + step]))
            at += step
        assert "".join(pieces) == text.text == source
        assert not any(REPLACEMENT in piece for piece in pieces)
        assert max(decoded) < len(ids)  # windows since the last whole character, never the whole output


def test_the_rule_met_first_ends_a_multi_token_commit_as_token_by_token():
    """A text rule met at an earlier token wins over a stop string whose start lies
    earlier in the text but which only a later token completes: plain decoding, one
    token at a time, never sees that stop string."""

    def ends_after_d(text: str):
        at = text.find("d")
        return None if at < 0 else (at + 1, at + 1)  # ends after "d", known once "d" is there

    def conditions() -> StopCondition:
        return StopCondition(eos_ids=set(), max_new_tokens=100, stop=("de",), decode=decode, end_at=ends_after_d)

    tokens = [2, 3, 4, 5]  # "cdef": the rule ends after "d" (the 2nd token); "de" starts earlier, ends later
    whole = conditions()
    kept, reason = whole.admit([0, 1], tokens)
    one = conditions()
    generated: list[int] = [0, 1]
    for token in tokens:
        got, why = one.admit(generated, [token])
        generated += got
        if why is not None:
            break
    assert (kept, reason) == (generated[2:], "stop") == ([2, 3], "stop")
    assert whole.text_end == one.text_end == 4
    # a stop string completed by an earlier token than the rule's wins, as token by token
    early = StopCondition(eos_ids=set(), max_new_tokens=100, stop=("bc",), decode=decode, end_at=ends_after_d)
    assert early.admit([0, 1], tokens) == ([2], "stop") and early.text_end == 1
