"""int8 products (kernels/int8.c): row-exact by construction, the same bits on both paths,
and the product of the int8 weights they stand for."""

from __future__ import annotations

import numpy as np
import pytest

from codespec.kernels import int8
from codespec.kernels import rowgemm as kernel
from codespec.forward.rowdecoder import bf16_bits, bf16_values

pytestmark = pytest.mark.skipif(kernel.library() is None, reason=f"no kernel build: {kernel.unavailable()}")

PATHS = [pytest.param(0, id="plain"),
         pytest.param(1, id="avx2", marks=pytest.mark.skipif(
             kernel.library() is None or int8.isa(kernel.library(), 1) != 1, reason="CPU without AVX2")),
         pytest.param(2, id="vnni", marks=pytest.mark.skipif(
             kernel.library() is None or int8.isa(kernel.library(), 2) != 2, reason="CPU without AVX-512 VNNI"))]
SHAPES = [(37, 96), (64, 100), (130, 896), (200, 4864)]  # ragged stripes, a short last row block, model widths


def matrix(n: int, k: int, seed: int) -> tuple[int8.Int8Matrix, np.ndarray]:
    lib = kernel.library()
    weight = bf16_bits(np.random.default_rng(seed).normal(0, k ** -0.5, (n, k)).astype(np.float32))
    packed = np.zeros(kernel.packed_elements((n, k)), dtype=np.uint16)
    lib.rowgemm_pack(weight.ctypes.data, n, k, k, packed.ctypes.data)
    return int8.pack(lib, packed.ctypes.data, n, k), weight


def rows(count: int, k: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(0, 1, (count, k)).astype(np.float32)
    x[0, 5] = 300.0  # an outlier: it coarsens its own block only
    return bf16_bits(x)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_every_row_gets_the_bits_it_gets_alone(isa, n, k):
    weight, _ = matrix(n, k, seed=n)
    x = rows(20, k, seed=k)
    bias = bf16_bits(np.linspace(-1, 1, n).astype(np.float32))
    lib = kernel.library()
    alone = np.concatenate([int8.linear(lib, isa, x[i : i + 1], weight, bias) for i in range(len(x))])
    for count in (1, 2, 5, 6, 7, 13, 20):  # every tile remainder
        assert np.array_equal(int8.linear(lib, isa, x[:count], weight, bias), alone[:count]), count
    order = np.random.default_rng(1).permutation(len(x))
    assert np.array_equal(int8.linear(lib, isa, x[order], weight, bias), alone[order])


@pytest.mark.parametrize("isa", [1, 2])
@pytest.mark.parametrize("n,k", SHAPES)
def test_every_path_gives_the_plain_loops_bits(isa, n, k):
    lib = kernel.library()
    if int8.isa(lib, isa) != isa:
        pytest.skip("CPU without " + ("AVX2" if isa == 1 else "AVX-512 VNNI"))
    weight, _ = matrix(n, k, seed=3)
    x = rows(9, k, seed=4)
    assert np.array_equal(int8.linear(lib, 0, x, weight), int8.linear(lib, isa, x, weight))


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_it_is_the_product_of_the_int8_weights(isa, n, k):
    weight, original = matrix(n, k, seed=5)
    x = rows(7, k, seed=6)
    out = bf16_values(int8.linear(kernel.library(), isa, x, weight)).astype(np.float64)
    values = bf16_values(x).astype(np.float64)
    exact = values @ int8.dequantized(weight).astype(np.float64).T
    # int16 rows: half a block step per input; then one bf16 rounding
    scale = np.abs(values) @ np.abs(int8.dequantized(weight).astype(np.float64)).T
    assert (np.abs(out - exact) <= 2 ** -8 * np.abs(exact) + 2 ** -14 * scale + 1e-6).all()
    # and the int8 weights are the bf16 ones within half a step
    step = weight.scale[:, None].astype(np.float64)
    assert (np.abs(int8.dequantized(weight) - bf16_values(original)) <= 0.5 * step * 1.001).all()
    assert np.abs(weight.q).max() <= 127
