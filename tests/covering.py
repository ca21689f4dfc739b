"""Parameters for tests whose axes multiply (the Triton kernels' fused variants x their
split configurations, under the interpreter: seconds a case): the default run takes a
covering set, in which every value of every axis appears at least once, and `-m slow`
(CI's slow step) every other combination."""

from __future__ import annotations

import itertools
from typing import Sequence

import pytest


def covering(*axes: Sequence, spread: Sequence[int] = ()) -> list:
    """pytest.params for every combination of the axes' values, those off the diagonal
    (value i % len(axis) of each axis, for i up to the longest axis) marked slow. An
    axis whose index is in `spread` holds tuples, each item its own argument.

    >>> [(p.values, [m.name for m in p.marks]) for p in covering([1, 2], "ab")]
    [((1, 'a'), []), ((1, 'b'), ['slow']), ((2, 'a'), ['slow']), ((2, 'b'), [])]
    >>> covering([(1, False), (2, True)], [0], spread=[0])[1].values
    (2, True, 0)
    """
    longest = max(len(axis) for axis in axes)
    diagonal = {tuple(i % len(axis) for axis in axes) for i in range(longest)}
    params = []
    for picks in itertools.product(*(range(len(axis)) for axis in axes)):
        values: list = []
        for index, (axis, pick) in enumerate(zip(axes, picks)):
            values.extend(axis[pick] if index in spread else (axis[pick],))
        params.append(pytest.param(*values, marks=() if picks in diagonal else (pytest.mark.slow,)))
    return params
