"""rowgemm: every row of a bf16 product computed alone, whatever the call around it."""

from __future__ import annotations

import os

import pytest
import torch

from codespec.forward import rowblocks
from codespec.kernels import native
from codespec.kernels import rowgemm as kernel
from tests.isa_paths import isa_params

pytestmark = pytest.mark.skipif(kernel.library() is None, reason=f"no rowgemm build: {kernel.unavailable()}")

PATHS = isa_params()
# K: whole chunks, a short tail, less than a chunk; N: whole tiles, ragged tiles and tasks
SHAPES = [(37, 96), (64, 100), (5, 31), (130, 896), (40, 1090)]  # 1090: AMX's spans of K, the last with a tail


def operands(n: int, k: int, rows: int = 70, seed: int = 0):
    """x [rows, k], the weight packed, bias [n], and the weight itself."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator).bfloat16()
    weight = (torch.randn(n, k, generator=generator) * k ** -0.5).bfloat16()
    bias = torch.randn(n, generator=generator).bfloat16()
    return x, kernel.pack(weight), bias, weight


@pytest.mark.parametrize("n,k", SHAPES)
def test_packing_keeps_every_weight(n, k):
    _, packed, _, weight = operands(n, k)
    stripes, halves, pairs, columns, two = packed.data.shape  # each stripe's halves hold their pairs in order
    assert packed.shape == (n, k) and (halves, columns, two) == (2, kernel.STRIPE // 2, 2)
    assert (stripes, pairs) == (-(-n // kernel.STRIPE), -(-k // 2))
    if n > 32:  # column 32 opens the second half
        assert packed.data[0, 1, 0, 0, 0] == weight[32, 0]
    assert torch.equal(kernel.unpack(packed), weight)


@pytest.mark.parametrize("isa_cap", PATHS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_every_row_count_gives_every_row_the_bits_it_gets_alone(isa_cap, n, k):
    x, weight, bias, _ = operands(n, k)
    alone = torch.cat([kernel.rowgemm(x[i : i + 1], weight, bias, isa_cap=isa_cap) for i in range(len(x))])
    for rows in range(1, len(x) + 1):  # crosses the streaming/tiled switch and every tile remainder
        assert torch.equal(kernel.rowgemm(x[:rows], weight, bias, isa_cap=isa_cap), alone[:rows]), rows
    shuffled = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    assert torch.equal(kernel.rowgemm(x[shuffled], weight, bias, isa_cap=isa_cap), alone[shuffled])


@pytest.mark.parametrize("isa_cap", PATHS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_it_is_the_linear_product_up_to_summation_order(isa_cap, n, k):
    x, packed, bias, weight = operands(n, k)
    for b in (bias, None):
        out = kernel.rowgemm(x, packed, b, isa_cap=isa_cap).float()
        reference = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
        # one bf16 rounding of the fp32 sum: half an ulp of the result, plus fp32 noise
        assert torch.allclose(out, reference.float(), rtol=2 ** -8, atol=1e-3)
        assert torch.allclose(out, kernel.rowgemm_ref(x, weight, b).float(), rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("isa_cap", PATHS)
def test_threads_and_strided_rows_change_nothing(isa_cap):
    x, weight, bias, _ = operands(130, 896, rows=12)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.rowgemm(x, weight, bias, isa_cap=isa_cap)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(kernel.rowgemm(x, weight, bias, isa_cap=isa_cap), one)
    wide = torch.zeros(12, 2 * 896, dtype=torch.bfloat16)
    wide[:, 896:] = x
    strided = wide[:, 896:]  # rows 2K apart: the kernel takes the row stride
    assert torch.equal(kernel.rowgemm(strided.unsqueeze(0), weight, bias, isa_cap=isa_cap)[0], one)


def test_bad_operands_are_refused_with_the_reason():
    x, packed, bias, weight = operands(8, 32)
    with pytest.raises(ValueError, match="bfloat16"):
        kernel.rowgemm(x.float(), packed, bias)
    with pytest.raises(ValueError, match="features"):
        kernel.rowgemm(x[:, :16], packed, bias)
    with pytest.raises(ValueError, match="packed"):
        kernel.rowgemm(x, weight, bias)
    with pytest.raises(ValueError, match="bias"):
        kernel.rowgemm(x, packed, bias[:4])
    with pytest.raises(ValueError, match="bfloat16"):
        kernel.pack(weight.float())


def test_a_failed_build_leaves_no_library_behind(tmp_path):
    (tmp_path / "broken.c").write_text("this is not C\n")
    target = tmp_path / "out" / "rowgemm-x.so"
    with pytest.raises(RuntimeError, match="broken.c"):
        native._build(native._compiler(), target, (tmp_path / "broken.c",))
    assert os.listdir(target.parent) == []


def test_installed_bf16_layers_use_it_in_passes_and_skip_the_probe(monkeypatch):
    if rowblocks.linear_kernel(torch.bfloat16, "cpu") != "rowgemm":
        pytest.skip("rowgemm is not this machine's linear kernel")
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 40)).bfloat16()
    packed = [kernel.pack(layer.weight) for layer in model]
    rowblocks.install(model)
    assert all(layer.weight.is_meta for layer in model)  # the stripes replace the weights
    x = torch.randn(1, 9, 64).bfloat16()
    expected = kernel.rowgemm(kernel.rowgemm(x, packed[0], model[0].bias), packed[1], model[1].bias)
    with rowblocks.blocked(4):
        assert torch.equal(model(x), expected)
    assert torch.equal(model(x), expected)  # a prefill multiplies alike
    monkeypatch.setattr(rowblocks, "_linear", lambda *a: pytest.fail("rowgemm layers need no probe"))
    assert rowblocks.probe(model) == rowblocks.MAX_BLOCK


def test_the_linear_kernel_can_be_chosen_and_a_typo_is_refused(monkeypatch):
    monkeypatch.setenv("CODESPEC_LINEAR", "onednn")
    assert rowblocks.linear_kernel(torch.bfloat16, "cpu") in ("onednn-packed", "torch")
    monkeypatch.setenv("CODESPEC_LINEAR", "torch")
    assert rowblocks.linear_kernel(torch.bfloat16, "cpu") == "torch"
    monkeypatch.setenv("CODESPEC_LINEAR", "fast")
    with pytest.raises(ValueError, match="CODESPEC_LINEAR"):
        rowblocks.linear_kernel(torch.bfloat16, "cpu")


def test_kernels_are_built_in_the_settings_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "_chosen_dir", [])
    monkeypatch.setenv("CODESPEC_CACHE_DIR", str(tmp_path / "env"))
    assert native._cache_dir() == tmp_path / "env" / "kernels"
    native.use_cache_dir(tmp_path / "cli")  # this process already loaded its library: nothing moves
    assert native._cache_dir() == tmp_path / "env" / "kernels"
    monkeypatch.setattr(native, "_chosen_dir", [tmp_path / "cli"])  # as a first use_cache_dir leaves it
    assert native._cache_dir() == tmp_path / "cli" / "kernels"


def test_a_compiler_that_fails_on_the_forward_still_builds_the_gemm(tmp_path):
    broken = tmp_path / "rowdecoder.c"
    broken.write_text("this is not C\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "SOURCES", (*native.GEMM, broken))
        patch.setattr(native, "_chosen_dir", [tmp_path])
        native.library.cache_clear()
        try:
            with pytest.warns(RuntimeWarning, match="C forward is unavailable"):
                lib = native.library()
            assert lib is not None and hasattr(lib, "rowgemm_bf16") and not native.has("rowdecoder_forward")
        finally:
            native.library.cache_clear()
    assert native.has("rowdecoder_forward")  # the real build again


def test_codespec_amx_off_keeps_avx512_bf16_and_a_typo_is_an_error(monkeypatch):
    from codespec.errors import SettingError

    monkeypatch.delenv("CODESPEC_AMX", raising=False)
    assert kernel.default_cap() == kernel.AMX
    monkeypatch.setenv("CODESPEC_AMX", "off")
    assert kernel.default_cap() == kernel.AVX512_BF16
    monkeypatch.setenv("CODESPEC_AMX", "no")
    with pytest.raises(SettingError, match="CODESPEC_AMX='no'"):
        kernel.default_cap()
