"""The batch's choice in one numba call (policy/fastchoice.py) is the reference's
(controller.pick_priced for each request, then choose_priced), draft for draft, on
random batches: trees and chains, matches and guesses, every cost shape."""

from __future__ import annotations

import random

import pytest

from codespec.index import Draft
from codespec.policy import controller, fastchoice

SOURCES = ("context", "index", "anchor", "anchor-guess", "model")


def _draft(rng: random.Random) -> Draft:
    n = rng.randint(0, 16)
    if rng.random() < 0.5:
        parents = tuple(range(-1, n - 1))
    else:
        parents = tuple(rng.randint(-1, i - 1) for i in range(n))
    return Draft(tuple(rng.randint(0, 50) for _ in range(n)), parents, tuple(rng.randint(0, 5) for _ in range(n)),
                 rng.randint(0, 70), rng.choice(SOURCES))


def _batch(rng: random.Random):
    shared = controller.AcceptanceTable()
    acceptances = []
    for _ in range(rng.randint(1, 8)):
        acceptance = controller.Acceptance(shared)
        for _ in range(rng.randint(0, 60)):
            acceptance.observe(rng.randint(0, 80), rng.random() < 0.6, rng.choice(SOURCES))
        acceptances.append(acceptance)
    candidates = [[_draft(rng) for _ in range(rng.randint(0, 3))] for _ in acceptances]
    contexts = [rng.randint(0, 3000) for _ in acceptances]
    base, per_row = rng.uniform(1e-3, 5e-2), rng.uniform(0, 2e-3)
    block = rng.choice((0, 16, 64))
    points = {(rows, keys): base + per_row * rows + rng.uniform(0, 1e-3) * keys / 1000
              + (base if block and rows > block else 0.0)
              for rows in (2, 8, 16, 32, 48, 64, 80) for keys in (500, 2000)}
    cost = controller.CostModel.of(points, block=block)
    return candidates, acceptances, cost, contexts


def _reference(candidates, acceptances, cost, contexts):
    picked = [controller.pick_priced(drafts, acceptance.rate, cost, context)
              for drafts, acceptance, context in zip(candidates, acceptances, contexts)]
    return [p.draft for p in controller.choose_priced(picked, cost, contexts)]


@pytest.mark.parametrize("seed", range(40))
def test_the_batch_choice_is_the_references(seed):
    rng = random.Random(seed)
    for _ in range(10):
        candidates, acceptances, cost, contexts = _batch(rng)
        assert fastchoice.choose_all(candidates, acceptances, cost, contexts) == \
            _reference(candidates, acceptances, cost, contexts)


def test_padded_costs_are_left_to_the_reference():
    candidates, acceptances, cost, contexts = _batch(random.Random(1))
    cost.key_span = lambda keys: keys  # padded calls: the reference prices them
    assert fastchoice.choose_all(candidates, acceptances, cost, contexts) is None


def test_the_warm_up_types_the_batch_choice():
    """In a fresh interpreter (numba's types are per process): after policy.warm.warm_up,
    a real batch's choice compiles nothing more (a cold cache compiled it for 4.4 s inside
    the first goodput request on the 2-core VM)."""
    import subprocess
    import sys

    check = "from tests.test_fastchoice import warmed_choice_types_nothing_new as f; f()"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def warmed_choice_types_nothing_new() -> None:
    from codespec.policy.warm import warm_up

    warm_up()
    before = len(fastchoice._choose_all.signatures)
    assert before, "the warm-up compiled nothing: the test looks in the wrong place"
    for seed in range(20):
        fastchoice.choose_all(*_batch(random.Random(seed)))
    assert len(fastchoice._choose_all.signatures) == before, fastchoice._choose_all.signatures
