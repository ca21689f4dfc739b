"""lmchoice: the greedy choice through lm_head's int8 screen is the full product's argmax,
token for token, including ties, near ties, zero and non-finite rows."""

from __future__ import annotations

import numpy as np
import pytest

from codespec.errors import SettingError
from codespec.kernels import int8, lmchoice
from codespec.kernels import rowgemm as kernel
from tests.isa_paths import isa_params
from codespec.forward.rowdecoder import bf16_bits, bf16_values

pytestmark = pytest.mark.skipif(kernel.library() is None, reason=f"no kernel build: {kernel.unavailable()}")

PATHS = isa_params()


class Head:
    """A bf16 lm_head [n, k] packed for rowgemm, and its screen."""

    def __init__(self, weight: np.ndarray) -> None:
        self.lib = kernel.library()
        self.weight = np.ascontiguousarray(weight, dtype=np.uint16)
        self.n, self.k = weight.shape
        self.packed = np.zeros(kernel.packed_elements((self.n, self.k)), dtype=np.uint16)
        self.lib.rowgemm_pack(self.weight.ctypes.data, self.n, self.k, self.k, self.packed.ctypes.data)
        self.screen = int8.pack(self.lib, self.packed.ctypes.data, self.n, self.k)

    def choices(self, isa: int, x: np.ndarray, kept: np.ndarray | None = None) -> np.ndarray:
        return lmchoice.choices(self.lib, kernel.isa(isa), x, self.screen, self.packed.ctypes.data, kept)

    def reference(self, isa: int, x: np.ndarray) -> np.ndarray:
        return lmchoice.choices_ref(self.lib, kernel.isa(isa), x, self.packed.ctypes.data, self.n)


def gaussian(shape: tuple[int, ...], scale: float, seed: int) -> np.ndarray:
    return bf16_bits(np.random.default_rng(seed).normal(0.0, scale, shape).astype(np.float32))


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("n,k", [(1000, 128), (333, 96), (64, 64), (2050, 256)])
def test_choices_are_the_full_products_argmax(isa, n, k):
    head = Head(gaussian((n, k), 0.05, seed=n))
    for seed in range(6):
        x = gaussian((9, k), 3.0, seed=seed)
        x[0, :4] = bf16_bits(np.array([60.0, -45.0, 80.0, 0.0], np.float32))  # outliers, as real hidden states have
        kept = np.zeros(9, dtype=np.int64)
        assert head.choices(isa, x, kept).tolist() == head.reference(isa, x).tolist()
        assert (kept >= 1).all()


@pytest.mark.parametrize("isa", PATHS)
def test_ties_go_to_the_first_maximum(isa):
    weight = gaussian((640, 128), 0.05, seed=1)
    for copy in (7, 70, 400):  # exact ties in other stripes and in the same one
        weight[copy] = weight[300]
    head = Head(weight)
    x = bf16_bits(bf16_values(weight[300]) * 20.0)[None, :]  # a row that prefers output 300 and its copies
    assert head.reference(isa, x).tolist() == [7]
    assert head.choices(isa, x).tolist() == [7]


@pytest.mark.parametrize("isa", PATHS)
def test_near_ties_the_screen_cannot_order(isa):
    """Two leading outputs one bf16 step apart in one weight: the int8 screen sees them
    equal, so the exact logits decide, whichever comes first."""
    weight = gaussian((256, 128), 0.05, seed=3)
    base = weight[5]
    rows = np.stack([bf16_bits(bf16_values(base) * 30.0), gaussian((128,), 1.0, seed=4)])
    k = int(np.argmax(np.abs(bf16_values(base))))  # the term that moves the leading logit most
    for low, high in ((10, 200), (200, 10)):
        nudged = weight.copy()
        nudged[low] = nudged[high] = base
        nudged[high, k] += 1  # one bf16 step larger in magnitude
        head = Head(nudged)
        assert head.choices(isa, rows).tolist() == head.reference(isa, rows).tolist()


@pytest.mark.parametrize("isa", PATHS)
def test_an_output_the_int8_screen_gets_far_wrong_is_still_chosen(isa):
    """Output 3 has one huge weight where the row is 0, so its int8 step is coarse and its
    other weights all round to 0: the screen puts it near 0 while its exact logit leads.
    Only the bound keeps it."""
    weight = gaussian((128, 64), 0.01, seed=10)
    weight[3] = bf16_bits(np.full(64, 0.049, np.float32))
    weight[3, 63] = bf16_bits(np.array([12.7], np.float32))[0]
    weight[90] = bf16_bits(np.full(64, 0.047, np.float32))  # the runner-up, screened well
    x = bf16_bits(np.r_[np.ones(63), 0.0].astype(np.float32))[None, :]
    head = Head(weight)
    assert head.reference(isa, x).tolist() == [3]
    assert head.choices(isa, x).tolist() == [3]


@pytest.mark.parametrize("isa", PATHS)
def test_rows_it_cannot_screen_are_computed_in_full(isa):
    head = Head(gaussian((500, 64), 0.05, seed=5))
    zero = np.zeros((1, 64), dtype=np.uint16)  # every logit 0: all tie, too many to examine
    nan = gaussian((1, 64), 1.0, seed=6)
    nan[0, 3] = 0x7FC0
    inf = gaussian((1, 64), 1.0, seed=7)
    inf[0, 9] = 0x7F80
    for row in (zero, nan, inf):
        kept = np.zeros(1, dtype=np.int64)
        assert head.choices(isa, row, kept).tolist() == head.reference(isa, row).tolist()
        assert kept[0] == 500  # the full row
    assert head.choices(isa, zero).tolist() == [0]


def test_the_screen_is_small_and_its_bounds_hold():
    weight = gaussian((300, 128), 0.05, seed=8)
    head = Head(weight)
    screen = head.screen
    assert screen.q.dtype == np.int8 and screen.q.nbytes == head.packed.nbytes // 2
    values = bf16_values(weight).astype(np.float64)
    q = screen.q.transpose(0, 2, 1, 3).reshape(-1, 128)[:300].astype(np.float64)
    error = np.abs(values - screen.scale[:, None].astype(np.float64) * q).max(axis=1)
    assert (error <= screen.slack).all() and (error <= screen.scale * 0.5 * 1.001).all()
    assert np.abs(q).max() <= 127


def test_a_peaked_row_keeps_few_tokens():
    weight = gaussian((4096, 256), 0.05, seed=9)
    head = Head(weight)
    x = bf16_bits(bf16_values(weight[1234]) * 40.0)[None, :]
    kept = np.zeros(1, dtype=np.int64)
    assert head.choices(kernel.SCALAR, x, kept).tolist() == [1234]
    assert 1 <= kept[0] < 50


def test_the_env_switch(monkeypatch):
    monkeypatch.delenv("CODESPEC_LM_SCREEN", raising=False)
    assert lmchoice.wanted()
    monkeypatch.setenv("CODESPEC_LM_SCREEN", "off")
    assert not lmchoice.wanted()
    monkeypatch.setenv("CODESPEC_LM_SCREEN", "no")
    with pytest.raises(SettingError, match="CODESPEC_LM_SCREEN"):
        lmchoice.wanted()


def first_max_c(logits: np.ndarray) -> int:
    logits = np.ascontiguousarray(logits, dtype=np.uint16)
    return int(lmchoice.declare(kernel.library()).lmchoice_first_max(logits.ctypes.data, logits.size))


@pytest.mark.parametrize("n", [1, 5, 16, 17, 48, 151936])
def test_the_vectorized_first_maximum_is_torchs_argmax(n):
    """lmchoice.c's first_max (the full rows' argmax) against numpy's, which torch's
    matches: the first maximum, a NaN above everything, -0 tying +0, at every length."""
    rng = np.random.default_rng(n)
    base = gaussian((n,), 2.0, seed=n)
    cases = [base, np.full(n, 0xFF80, np.uint16)]  # all -inf
    for at in {0, n // 2, n - 1}:
        tie = base.copy()
        top = bf16_bits(np.array([100.0], np.float32))[0]
        tie[at] = tie[-1 - at // 3] = top  # two equal maxima: the first wins
        cases.append(tie)
        nan = base.copy()
        nan[at] = 0x7FC0
        nan[rng.integers(0, n)] = 0x7FC1  # a second NaN payload, maybe earlier
        cases.append(nan)
        inf = base.copy()
        inf[at] = 0x7F80
        cases.append(inf)
        zeros = np.full(n, 0xBF80, np.uint16)  # -1 everywhere but a -0 and a +0
        zeros[at] = 0x8000
        zeros[n - 1] = 0x0000
        cases.append(zeros)
    for logits in cases:
        assert first_max_c(logits) == int(lmchoice.first_max(logits[None, :])[0])
