"""The persistent-kernel probe (`persist` stage, 2026-11-27): would one kernel running a
step's products reach the plain-step bar, where launching them did not?

The 2026-11-27 H100 run cut a step from 273 launches to 125 and it went from 1.21 to 1.19
ms: the launches were not the cost. Each product is a chain of dependent memory round
trips, and while it runs no other weights stream. A persistent kernel (Hazy Research's
Llama-1B "megakernel") keeps every SM's programs alive across the products, meets at a
grid-wide barrier between them, and can warm the next product's weights into L2 before
it waits there. Building that for the model is a large change; this probe prices it
first, on the layer's four products alone (the default model's shapes, 24 layers of
their own weights, one row, fp32 activations; no norm, attention or epilogue):

- `launched`: one launch a product in a CUDA graph, as the fused layers run now
  (and with PDL, each product warming its own weights before it waits);
- `persistent`: all 96 products in one launch of one program an SM, a barrier between
  them (and warming the next product's weights before each barrier);
- `barriers`: the persistent launch without the products: what 96 barriers cost;
- `launched flags` (2026-11-27): one launch a product as a programmatic dependent, but
  waiting on a count the launch before raises after its stores (release/acquire at GPU
  scope) instead of `griddepcontrol.wait`, which waits for that launch to end and flush:
  what a launch boundary costs beyond its last store. PDL launches a kernel only once
  every program of the one before has started, so its spinning programs never keep the
  one before from running.

All compute each output the same way (one program a block of outputs, its K in order),
so the outputs' bits are the same in every mode; the probe reports that and the error
against torch's float32 chain. A barrier spins at most `spin_limit` times and then
gives up and flags it: a grid that is not all resident at once (or the interpreter,
which runs programs one after another) returns wrong numbers rather than hanging the
run. The tests run the kernel under the interpreter with one program; its sm_90 build
is checked offline (tests/kernels/test_sm90_compile.py)."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from codespec.kernels._triton_linear import sector_prefetch
from codespec.kernels._triton_pdl import launch_options, pdl_done, pdl_start, pdl_wait, wait_count

# The default model's layer for one row, (outputs, inputs): q/k/v, o, gate/up, down. The
# activations run a -> b -> a -> c -> a: o reads q/k/v's first 896 outputs and down
# gate/up's first 4,864 (no attention, no SiLU: the bytes and the chain are the point).
LAYER = ((1152, 896), (896, 896), (9728, 896), (896, 4864))
SECTOR = tl.constexpr(16)  # bf16 elements in a 32-byte sector: one L2 prefetch each
# Reads of the count before a barrier gives up: a met barrier takes ~10-50 us, a read
# ~1 us, so 65,536 reads (~60 ms) is a barrier that will not be met, and 95 of them
# still cost the run seconds, not minutes.
SPIN_LIMIT = 1 << 16


@triton.jit
def _product(w_ptr, x_ptr, y_ptr, pid, programs, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, WORK: tl.constexpr):
    # y = W x for one row, a program per block of BLOCK_N outputs (blocks pid, pid +
    # programs, ...), its K in BLOCK_K steps in order, unrolled so a block's loads are in
    # flight together (one program an SM has few warps to hide a chain of round trips).
    # x was written by other programs of this launch (persistent) or by the launch
    # before: read past L1.
    if WORK:
        for block in range(pid, N // BLOCK_N, programs):
            n = block * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros([BLOCK_N], tl.float32)
            for first in tl.static_range(0, K, BLOCK_K):
                k = first + tl.arange(0, BLOCK_K)
                x = tl.load(x_ptr + k, cache_modifier=".cg")
                w = tl.load(w_ptr + n[:, None] * K + k[None, :]).to(tl.float32)
                acc += tl.sum(w * x[None, :], axis=1)
            tl.store(y_ptr + n, acc)


@triton.jit
def _warm(w_ptr, pid, programs, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, SECTORS: tl.constexpr):
    # This program's weight rows of the product into L2, one prefetch a sector.
    column = tl.arange(0, SECTORS) * SECTOR
    for block in range(pid, N // BLOCK_N, programs):
        row = block * BLOCK_N + tl.arange(0, BLOCK_N)
        sector_prefetch(w_ptr + row[:, None] * K + column[None, :], (column[None, :] < K) & (row[:, None] >= 0))


@triton.jit
def _phase(w_ptr, x_ptr, y_ptr, pid, programs, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr, SECTORS: tl.constexpr, WORK: tl.constexpr, WARM: tl.constexpr):
    # One product: computed, or (WARM) its weights warmed.
    if WARM:
        _warm(w_ptr, pid, programs, N, K, BLOCK_N, SECTORS)
    else:
        _product(w_ptr, x_ptr, y_ptr, pid, programs, N, K, BLOCK_N, BLOCK_K, WORK)


@triton.jit
def _layer_phase(w_ptr, a_ptr, b_ptr, c_ptr, t, pid, programs, N0: tl.constexpr, K0: tl.constexpr,
                 N1: tl.constexpr, K1: tl.constexpr, N2: tl.constexpr, K2: tl.constexpr, N3: tl.constexpr,
                 K3: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_K_LONG: tl.constexpr,
                 WORK: tl.constexpr, WARM: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr,
                 S3: tl.constexpr):
    # Product t of the chain (layer t // 4, its product t % 4), its weights after the
    # layer's earlier products': a -> b, b -> a, a -> c, c -> a.
    size: tl.constexpr = N0 * K0 + N1 * K1 + N2 * K2 + N3 * K3
    w = w_ptr + (t // 4) * size  # 24 of the default model's layers: 357M elements, within int32
    p = t % 4
    if p == 0:
        _phase(w, a_ptr, b_ptr, pid, programs, N0, K0, BLOCK_N, BLOCK_K, S0, WORK, WARM)
    elif p == 1:
        _phase(w + N0 * K0, b_ptr, a_ptr, pid, programs, N1, K1, BLOCK_N, BLOCK_K, S1, WORK, WARM)
    elif p == 2:
        _phase(w + N0 * K0 + N1 * K1, a_ptr, c_ptr, pid, programs, N2, K2, BLOCK_N, BLOCK_K, S2, WORK, WARM)
    else:
        _phase(w + N0 * K0 + N1 * K1 + N2 * K2, c_ptr, a_ptr, pid, programs, N3, K3, BLOCK_N, BLOCK_K_LONG, S3, WORK,
               WARM)


@triton.jit
def _grid_barrier(sync_ptr, flag_ptr, target, SPIN_LIMIT: tl.constexpr):
    # Every program's stores before the count says so (CTA barrier, then acq_rel at GPU
    # scope); then wait for `target` arrivals, acquiring what the others stored. Gives up
    # after SPIN_LIMIT reads and raises the flag: wrong numbers, never a hung run.
    tl.debug_barrier()
    arrived = tl.atomic_add(sync_ptr, 1, sem="acq_rel", scope="gpu") + 1
    wait_count(sync_ptr, arrived, target, flag_ptr, SPIN_LIMIT)


@triton.jit
def _chain_kernel(w_ptr, a_ptr, b_ptr, c_ptr, sync_ptr, flag_ptr, first, last, N0: tl.constexpr, K0: tl.constexpr,
                  N1: tl.constexpr, K1: tl.constexpr, N2: tl.constexpr, K2: tl.constexpr, N3: tl.constexpr,
                  K3: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, S3: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_K_LONG: tl.constexpr, WORK: tl.constexpr,
                  PREFETCH: tl.constexpr, PDL: tl.constexpr, SPIN_LIMIT: tl.constexpr, FLAGS: tl.constexpr):
    # Products first..last-1 of the chain, a grid barrier between two (persistent where
    # the launch holds more than one). PREFETCH: this program's weights of its first
    # product warmed before it waits for the launch before (PDL), and of each next one
    # before each barrier. FLAGS: it waits for every program of the launches before to
    # have counted its stores, not for them to end (griddepcontrol.wait), and counts its own.
    pid, programs = tl.program_id(0), tl.num_programs(0)
    pdl_start(PDL)
    if PREFETCH:
        _layer_phase(w_ptr, a_ptr, b_ptr, c_ptr, first, pid, programs, N0, K0, N1, K1, N2, K2, N3, K3, BLOCK_N,
                     BLOCK_K, BLOCK_K_LONG, WORK, True, S0, S1, S2, S3)
    if FLAGS:
        wait_count(sync_ptr, tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu"), first * programs, flag_ptr,
                   SPIN_LIMIT)
    else:
        pdl_wait(PDL)
    for t in range(first, last):
        _layer_phase(w_ptr, a_ptr, b_ptr, c_ptr, t, pid, programs, N0, K0, N1, K1, N2, K2, N3, K3, BLOCK_N,
                     BLOCK_K, BLOCK_K_LONG, WORK, False, S0, S1, S2, S3)
        if t + 1 < last:
            if PREFETCH:
                _layer_phase(w_ptr, a_ptr, b_ptr, c_ptr, t + 1, pid, programs, N0, K0, N1, K1, N2, K2, N3, K3,
                             BLOCK_N, BLOCK_K, BLOCK_K_LONG, WORK, True, S0, S1, S2, S3)
            _grid_barrier(sync_ptr, flag_ptr, (t + 1 - first) * programs, SPIN_LIMIT)
    pdl_done(sync_ptr, 0, FLAGS)  # with FLAGS: this program's stores, then its count (the next launch acquires both)


class Chain:
    """`layers` layers of LAYER's products (or `layer`'s shapes), their weights one flat
    bf16 tensor, scaled so the activations keep their size; the activations, the
    barrier's count and its flag."""

    def __init__(self, layers: int, device: str, layer: tuple[tuple[int, int], ...] = LAYER, seed: int = 0,
                 block_n: int = 8, block_k: int = 128, block_k_long: int = 256) -> None:
        (n0, k0), (n1, k1), (n2, k2), (n3, k3) = layer
        for n, _ in layer:
            assert n % block_n == 0, layer
        assert k0 % block_k == 0 and k1 % block_k == 0 and k2 % block_k == 0 and k3 % block_k_long == 0, layer
        self.layer, self.layers = layer, layers
        self.block_n, self.block_k, self.block_k_long = block_n, block_k, block_k_long
        self.sectors = [triton.next_power_of_2(triton.cdiv(k, SECTOR.value)) for _, k in layer]
        generator = torch.Generator(device=device).manual_seed(seed)
        self.flat = torch.cat([torch.randn(n * k, generator=generator, device=device).div_(k ** 0.5)
                               .to(torch.bfloat16) for _ in range(layers) for n, k in layer])
        pieces = iter(self.flat.split([n * k for _ in range(layers) for n, k in layer]))
        # each layer's products as views of the flat weights (the reference's)
        self.weights = [[next(pieces).view(n, k) for n, k in layer] for _ in range(layers)]
        width = max(n for n, _ in layer)
        self.a, self.b, self.c = (torch.zeros(width, device=device) for _ in range(3))
        self.x = torch.randn(layer[0][1], generator=generator, device=device)
        self.sync = torch.zeros(1, dtype=torch.int32, device=device)
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)

    @property
    def bytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def reference(self) -> torch.Tensor:
        """torch's float32 chain: a -> b -> a -> c -> a a layer."""
        a = self.x.clone()
        for n_kv, n_o, n_gu, n_down in self.weights:
            b = n_kv.float() @ a
            a = n_o.float() @ b[: n_o.shape[1]]
            c = n_gu.float() @ a
            a = n_down.float() @ c[: n_down.shape[1]]
        return a

    def run(self, programs: int, per_launch: int, work: bool = True, prefetch: bool = False, pdl: bool = False,
            spin_limit: int = SPIN_LIMIT, flags: bool = False) -> torch.Tensor:
        """The whole chain in launches of `per_launch` products (1: one launch each; all
        of them: one persistent launch) of `programs` programs each; the last output.
        `flags` (one product a launch): each launch waits on the count of the programs
        before it that stored, not on their end."""
        assert not flags or per_launch == 1, "flags count launches of one product"
        (n0, k0), (n1, k1), (n2, k2), (n3, k3) = self.layer
        sectors = self.sectors
        self.a[: k0].copy_(self.x)
        self.sync.zero_()
        total = 4 * self.layers
        for first in range(0, total, per_launch):  # a launch of one product has no barrier
            _chain_kernel[(programs,)](
                self.flat, self.a, self.b, self.c, self.sync, self.flag, first, min(first + per_launch, total),
                N0=n0, K0=k0, N1=n1, K1=k1, N2=n2, K2=k2, N3=n3, K3=k3, S0=sectors[0], S1=sectors[1],
                S2=sectors[2], S3=sectors[3], BLOCK_N=self.block_n, BLOCK_K=self.block_k,
                BLOCK_K_LONG=self.block_k_long, WORK=work, PREFETCH=prefetch, PDL=pdl, SPIN_LIMIT=spin_limit,
                FLAGS=flags,
                num_warps=4, **launch_options(pdl))
        return self.a[: n3]


def persist_probe(layers: int = 24) -> dict[str, Any]:
    """On CUDA: each mode's device us a step (CUDA graphs), against the chain's weights
    at the measured copy bandwidth; outputs against torch's and against each other."""
    from gpu_measure import _graph_us, hbm_copy_gbs

    programs = torch.cuda.get_device_properties(0).multi_processor_count  # one an SM, all resident
    chain = Chain(layers, "cuda")
    total = 4 * layers
    floor_us = chain.bytes / (hbm_copy_gbs() * 1e3)
    reference = chain.reference()
    pdl = torch.cuda.get_device_capability()[0] >= 9
    modes = {"launched": dict(per_launch=1), "launched pdl/prefetch": dict(per_launch=1, pdl=pdl, prefetch=pdl),
             # the same launches, each waiting on the count of stores before it, not their end
             "launched flags": dict(per_launch=1, pdl=pdl, prefetch=pdl, flags=True),
             "persistent": dict(per_launch=total), "persistent prefetch": dict(per_launch=total, prefetch=True),
             "barriers": dict(per_launch=total, work=False)}
    result: dict[str, Any] = {"programs": programs, "products": total, "weights_mb": round(chain.bytes / 1e6, 1),
                              "floor_us": round(floor_us, 1)}
    outputs = {}
    for name, mode in modes.items():
        chain.flag.zero_()
        got = chain.run(programs, **mode).clone()
        gave_up = bool(chain.flag.item())
        entry: dict[str, Any] = {"barrier_gave_up": gave_up}
        if mode.get("work", True):
            outputs[name] = got
            entry["relative_error"] = round(float((got - reference).norm() / reference.norm()), 6)
        if not gave_up:
            entry["us"] = round(_graph_us(lambda mode=mode: chain.run(programs, **mode), calls=3), 1)
            if mode.get("work", True):
                entry["over_floor"] = round(entry["us"] / floor_us, 2)
            else:
                entry["us_per_barrier"] = round(entry["us"] / (total - 1), 2)
        result[name] = entry
    result["same_bits_every_mode"] = all(torch.equal(got, outputs["launched"]) for got in outputs.values())
    return result
