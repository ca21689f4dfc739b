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
