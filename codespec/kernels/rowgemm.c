/* Row-exact bf16 matrix products for CPU decode steps and verify passes.
 *
 *   out[m, n] = bf16(dot(x[m, :], w[n, :]) + bias[n])
 *
 * Every output is one dot product computed the same way whatever the call around it:
 * how many rows it has, how they are tiled, which thread takes them. So a row of a
 * 40-row verify pass gets exactly the bits of the one-row decode step it stands for, by
 * construction, on any CPU (oneDNN had to be probed for that, and on one machine it
 * changed kernels past 32 rows).
 *
 * Weights are packed once (rowgemm.py `pack`) into stripes of STRIPE output columns,
 * each in two halves of HALF columns:
 *   packed[s][h][p][c][e] = w[s * STRIPE + h * HALF + c, 2 * p + e]   (zero-padded to whole
 *   stripes, even K)
 * so one 64-byte load holds 16 columns x one pair of k, and a stripe is two sequential
 * streams (a decode step reads the weights at memory speed: ~26 GB/s on the 2-core EPYC
 * VM, where oneDNN's two-row GEMM reads ~16 GB/s). Halves, rather than whole 64-column
 * rows of pairs, because the tile unit (amx.c) takes a 32-row pass half a stripe at a
 * time: each half then streams contiguously. On the AMX VM, products with the weights in
 * memory, medians of 11 interleaved: 4864 x 896 one row 25.4 -> 22.5 ms for 24, 32 rows
 * 39.1 -> 38.1; 896 x 4864 one row 14.1 -> 11.7, 32 rows 21.9 -> 19.5.
 *
 * The dot product (`rowgemm_isa` == 2, AVX-512 BF16): lane c of an fp32 accumulator
 * takes pair p = 0, 1, 2, ... in order, one VDPBF16PS each (x's pair broadcast), then the
 * bias, then one rounding to bf16 (VCVTNEPS2BF16, nearest even). Nothing crosses lanes,
 * so a row's sums do not depend on the other rows in its tile or on the tile's size.
 * `rowgemm_isa` == 3 runs the same layout on Intel's tile unit (amx.c), with other bits
 * (TDPBF16PS sums a block of 32 values its own way), so a machine runs one of 2 and 3.
 * `rowgemm_isa` == 0 is a scalar loop over the same layout (any CPU: tests, and the
 * reference of the contract; the engine does not use it for speed). Threads split the
 * stripes with OpenMP; the library links libgomp.so.1, which resolves to torch's copy.
 *
 * Layouts: x [M, K] bf16 (row stride ldx, K even), packed as above, bias [N] bf16 or
 * NULL, out [M, N] bf16 (row stride ldo). bf16 travels as uint16_t.
 */
#include "bf16.h"
#include <alloca.h>

#define BLOCKS 4
#define LANES 16
#define TM 6 /* rows of x per whole-stripe tile: TM x BLOCKS accumulators + BLOCKS + 1 in 32 registers */

/* ---------------------------------------------------------------- scalar (isa 0) */

static void stripe_scalar(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias,
                          uint16_t *out, int64_t ldo, int64_t M, int64_t pairs, int64_t n0, int64_t columns) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < columns; c++) {
            const uint16_t *xr = x + m * ldx;
            float sum = 0.0f;
            for (int64_t p = 0; p < pairs; p++) {
                const uint16_t *wp = stripe + stripe_at(pairs, p, c);
                sum += bf16_to_f32(xr[2 * p]) * bf16_to_f32(wp[0]) + bf16_to_f32(xr[2 * p + 1]) * bf16_to_f32(wp[1]);
            }
            if (bias) sum += bf16_to_f32(bias[n0 + c]);
            out[m * ldo + n0 + c] = f32_to_bf16(sum);
        }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* ---------------------------------------------------------------- AVX-512 BF16 (isa 2) */

#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INLINE inline __attribute__((always_inline))

/* Rows m0..m0+mt-1 against `nb` blocks of 16 columns from n0: the whole stripe (nb 4,
 * `first` its first half), or one half of it (nb 2, `first` that half). `mt` and `nb` are
 * constants at every call (the switches below), so the accumulators stay in registers:
 * 6 x 4 (`TM`), or up to 12 x 2 (`TALL`), with the weights and a broadcast, in 32. Every
 * output is one lane taking pair p = 0, 1, 2, ... in order, one VDPBF16PS each, then the
 * bias, then one rounding, whichever tile computes it: the same bits. */
#define TALL 12
AVX512BF16 static INLINE void tile(const uint16_t *x, int64_t ldx, const uint16_t *first, int64_t pairs,
                                   const uint16_t *bias, uint16_t *out, int64_t ldo, int64_t m0, const int mt,
                                   const int nb, int64_t n0, int64_t columns) {
    __m512 acc[TALL][BLOCKS];
    for (int i = 0; i < mt; i++)
        for (int b = 0; b < nb; b++) acc[i][b] = _mm512_setzero_ps();
    const uint16_t *xr[TALL];
    for (int i = 0; i < mt; i++) xr[i] = x + (m0 + i) * ldx;
    const uint16_t *half[2] = {first, first + stripe_at(pairs, 0, HALF)}; /* nb 2 reads half[0] alone */
    for (int64_t p = 0; p < pairs; p++) {
        __m512bh wv[BLOCKS];
        for (int b = 0; b < nb; b++)
            wv[b] = (__m512bh)_mm512_loadu_si512(half[b / 2] + (p * HALF + b % 2 * LANES) * 2);
        for (int i = 0; i < mt; i++) {
            int32_t pair;
            memcpy(&pair, xr[i] + 2 * p, sizeof pair);
            __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            for (int b = 0; b < nb; b++) acc[i][b] = _mm512_dpbf16_ps(acc[i][b], xv, wv[b]);
        }
    }
    for (int b = 0; b < nb; b++) {
        int64_t c0 = b * LANES;
        if (c0 >= columns) break;
        __mmask16 keep = columns - c0 >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << (columns - c0)) - 1u);
        __m512 add = _mm512_setzero_ps();
        if (bias) /* widen bf16 to fp32: shift into the high half */
            add = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(keep, bias + n0 + c0)), 16));
        for (int i = 0; i < mt; i++) {
            __m256bh h = _mm512_cvtneps_pbh(_mm512_add_ps(acc[i][b], add));
            _mm256_mask_storeu_epi16(out + (m0 + i) * ldo + n0 + c0, keep, (__m256i)h);
        }
    }
}

/* A pass of TM + 1 .. TALL rows: each half of the stripe streamed once, all rows at a time
 * (6-row tiles would stream the whole stripe twice: 7 rows' products 21.2 ms against 16.0
 * for the default model on the Zen 5 VM, docs/decisions.md). */
AVX512BF16 static void stripe_tall(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias,
                                   uint16_t *out, int64_t ldo, int64_t M, int64_t pairs, int64_t n0,
                                   int64_t columns) {
    for (int h = 0; h < 2 && h * HALF < columns; h++) {
        const uint16_t *half = stripe + stripe_at(pairs, 0, h * HALF);
        int64_t c0 = n0 + h * HALF, width = columns - h * HALF < HALF ? columns - h * HALF : HALF;
        switch (M) {
        case 7: tile(x, ldx, half, pairs, bias, out, ldo, 0, 7, 2, c0, width); break;
        case 8: tile(x, ldx, half, pairs, bias, out, ldo, 0, 8, 2, c0, width); break;
        case 9: tile(x, ldx, half, pairs, bias, out, ldo, 0, 9, 2, c0, width); break;
        case 10: tile(x, ldx, half, pairs, bias, out, ldo, 0, 10, 2, c0, width); break;
        case 11: tile(x, ldx, half, pairs, bias, out, ldo, 0, 11, 2, c0, width); break;
        default: tile(x, ldx, half, pairs, bias, out, ldo, 0, 12, 2, c0, width); break;
        }
    }
}

AVX512BF16 static void stripe_avx512bf16(const uint16_t *x, int64_t ldx, const uint16_t *stripe,
                                         const uint16_t *bias, uint16_t *out, int64_t ldo, int64_t M, int64_t pairs,
                                         int64_t n0, int64_t columns) {
    if (M > TM && M <= TALL) {
        stripe_tall(x, ldx, stripe, bias, out, ldo, M, pairs, n0, columns);
        return;
    }
    for (int64_t m = 0; m < M; m += TM) {
        switch (M - m < TM ? M - m : TM) {
        case 1: tile(x, ldx, stripe, pairs, bias, out, ldo, m, 1, BLOCKS, n0, columns); break;
        case 2: tile(x, ldx, stripe, pairs, bias, out, ldo, m, 2, BLOCKS, n0, columns); break;
        case 3: tile(x, ldx, stripe, pairs, bias, out, ldo, m, 3, BLOCKS, n0, columns); break;
        case 4: tile(x, ldx, stripe, pairs, bias, out, ldo, m, 4, BLOCKS, n0, columns); break;
        case 5: tile(x, ldx, stripe, pairs, bias, out, ldo, m, 5, BLOCKS, n0, columns); break;
        default: tile(x, ldx, stripe, pairs, bias, out, ldo, m, 6, BLOCKS, n0, columns); break;
        }
    }
}

/* ---------------------------------------------------------------- AVX2 + FMA (isa 1)
 *
 * For CPUs without AVX-512 (AMD Zen 2/3, Intel client cores), where torch's bf16 GEMM
 * costs about a row's weight read per row (a 32-row verify pass ~30x a one-row step on
 * an AVX2 EPYC). x is widened to fp32 (exact); lane c of an 8-wide
 * fp32 accumulator takes pair p = 0, 1, 2, ... in order, two FMAs each (even k, then odd
 * k; the pair's two weights widened exactly: shift, mask), then the bias (or +0), then
 * one rounding to bf16 (f32_to_bf16, nearest even). Again nothing crosses lanes, and
 * every tile shape below does those same operations per output, so the tile picked for
 * a call (by its row count) never changes a bit. Rows are widened TM2 at a time per stripe
 * (on the stack: no allocation can fail mid-product).
 * Measured (2 threads, 4864x896): 1 row 0.18 ms, 32 rows 2.9 ms, 256 rows 19 ms, where
 * torch's bf16 F.linear took 0.85, 13.8 and 95 ms, and its fp32 one 0.74, 4.6 and 23. The bits differ from isa 2's (another
 * sum) and from the scalar loop's (no FMA): a machine runs one path. */

#define AVX2 __attribute__((target("avx2,fma")))
#define LANES8 8
#ifndef TM2
#define TM2 5 /* rows of a weights-first tile: TM2 x 2 accumulators, 4 weights, a mask, a broadcast: 16 registers.
                 * 4864x896 at 256 rows, 2 threads, AVX2 EPYC VM: 4 rows 24.8 ms, 5 rows 19.3, 6 rows 22.2 */
#endif

/* Rows m0..m0+mt-1 against 8-column blocks b0..b0+nb-1 of a stripe (one half's), weights
 * first: the nb blocks of a pair widened once, then every row's two broadcasts. */
AVX2 static INLINE void tile_w(const float *x32, int64_t K, const uint16_t *stripe, float *acc_out,
                               int64_t pairs, int64_t m0, const int mt, const int b0, const int nb) {
    __m256 acc[TM2][2];
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    for (int i = 0; i < mt; i++)
        for (int b = 0; b < nb; b++) acc[i][b] = _mm256_setzero_ps();
    const uint16_t *wp = stripe + stripe_at(pairs, 0, b0 * LANES8);
    const float *xr = x32 + m0 * K;
    for (int64_t p = 0; p < pairs; p++, wp += HALF * 2) {
        __m256 we[2], wo[2];
        for (int b = 0; b < nb; b++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(wp + b * LANES8 * 2));
            we[b] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
            wo[b] = _mm256_castsi256_ps(_mm256_and_si256(raw, high));
        }
        for (int i = 0; i < mt; i++) {
            __m256 xe = _mm256_broadcast_ss(xr + i * K + 2 * p), xo = _mm256_broadcast_ss(xr + i * K + 2 * p + 1);
            for (int b = 0; b < nb; b++) {
                acc[i][b] = _mm256_fmadd_ps(xe, we[b], acc[i][b]);
                acc[i][b] = _mm256_fmadd_ps(xo, wo[b], acc[i][b]);
            }
        }
    }
    for (int i = 0; i < mt; i++)
        for (int b = 0; b < nb; b++) _mm256_storeu_ps(acc_out + i * STRIPE + (b0 + b) * LANES8, acc[i][b]);
}

/* Rows first: each row's two broadcasts once, then the nb 8-column blocks from block b0
 * widened one at a time (one or two rows against the whole stripe: a decode step
 * streams it once). */
AVX2 static INLINE void tile_x(const float *x32, int64_t K, const uint16_t *stripe, float *acc_out,
                               int64_t pairs, int64_t m0, const int mt, const int b0, const int nb) {
    __m256 acc[2][8];
    for (int i = 0; i < mt; i++)
        for (int b = 0; b < nb; b++) acc[i][b] = _mm256_setzero_ps();
    const uint16_t *half[2] = {stripe, stripe + stripe_at(pairs, 0, HALF)};
    const float *xr = x32 + m0 * K;
    for (int64_t p = 0; p < pairs; p++) {
        __m256 xe[2], xo[2];
        for (int i = 0; i < mt; i++) {
            xe[i] = _mm256_broadcast_ss(xr + i * K + 2 * p);
            xo[i] = _mm256_broadcast_ss(xr + i * K + 2 * p + 1);
        }
        for (int b = 0; b < nb; b++) {
            int c = (b0 + b) * LANES8; /* the block's first column in the stripe */
            const uint16_t *wp = half[c / HALF] + (p * HALF + c % HALF) * 2;
            __m256i raw = _mm256_loadu_si256((const __m256i *)wp);
            __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
            __m256 wo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(raw, 16), 16));
            for (int i = 0; i < mt; i++) {
                acc[i][b] = _mm256_fmadd_ps(xe[i], we, acc[i][b]);
                acc[i][b] = _mm256_fmadd_ps(xo[i], wo, acc[i][b]);
            }
        }
    }
    for (int i = 0; i < mt; i++)
        for (int b = 0; b < nb; b++) _mm256_storeu_ps(acc_out + i * STRIPE + (b0 + b) * LANES8, acc[i][b]);
}

/* The sums of `rows` rows (at most TM2) into acc [rows][STRIPE]: the whole stripe. */
AVX2 static void stripe_sums_avx2(const float *x32, int64_t K, const uint16_t *stripe, float *acc, int64_t pairs,
                                  int64_t m0, int rows) {
    if (rows == 1) { tile_x(x32, K, stripe, acc, pairs, m0, 1, 0, 8); return; }
    if (rows == 2) { tile_x(x32, K, stripe, acc, pairs, m0, 2, 0, 4); tile_x(x32, K, stripe, acc, pairs, m0, 2, 4, 4);
                     return; }
    for (int b0 = 0; b0 < 8; b0 += 2) /* 16 columns: one cache line of each pair's row in a half */
        switch (rows) {
        case 3: tile_w(x32, K, stripe, acc, pairs, m0, 3, b0, 2); break;
#if TM2 >= 5
        case 4: tile_w(x32, K, stripe, acc, pairs, m0, 4, b0, 2); break;
#endif
#if TM2 >= 6
        case 5: tile_w(x32, K, stripe, acc, pairs, m0, 5, b0, 2); break;
#endif
        default: tile_w(x32, K, stripe, acc, pairs, m0, TM2, b0, 2); break;
        }
}

static void stripe_avx2(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias, uint16_t *out,
                        int64_t ldo, int64_t M, int64_t pairs, int64_t n0, int64_t columns) {
    const int64_t K = 2 * pairs;
    float acc[TM2 * STRIPE];
    float *x32 = alloca((size_t)(TM2 * K) * sizeof(float)); /* TM2 rows widened: 97 KB at K = 4864 */
    for (int64_t m = 0; m < M; m += TM2) {
        int rows = M - m < TM2 ? (int)(M - m) : TM2;
        for (int i = 0; i < rows; i++)
            for (int64_t k = 0; k < K; k++) x32[i * K + k] = bf16_to_f32(x[(m + i) * ldx + k]);
        stripe_sums_avx2(x32, K, stripe, acc, pairs, 0, rows);
        for (int i = 0; i < rows; i++)
            for (int64_t c = 0; c < columns; c++) {
                float add = bias ? bf16_to_f32(bias[n0 + c]) : 0.0f;
                out[(m + i) * ldo + n0 + c] = f32_to_bf16(acc[i * STRIPE + c] + add);
            }
    }
}
#endif

/* The path this CPU runs: 3 (AMX, amx.c), 2 (AVX-512 BF16), 1 (AVX2 + FMA) or 0 (scalar),
 * at most `cap`. */
int rowgemm_isa(int cap) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (cap >= 3 && amx_ready()) return 3;
    if (cap >= 2 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")) return 2;
    if (cap >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    (void)cap;
    return 0;
}

int rowgemm_stripe(void) { return STRIPE; }

/* K is the padded (even) length: packed holds K / 2 pairs a column. */
void rowgemm_bf16(int isa, const uint16_t *x, int64_t ldx, const uint16_t *packed, const uint16_t *bias, uint16_t *out,
                  int64_t ldo, int64_t M, int64_t N, int64_t K) {
    int64_t stripes = (N + STRIPE - 1) / STRIPE, pairs = K / 2;
    if (isa == 3 && !amx_ready()) isa = 2; /* a caller that skipped rowgemm_isa: never a SIGILL */
    /* many rows over a long K: amx.c's spans, the same bits (256 rows of the default
     * model's down product, 2 threads: 860 GMAC/s against 276 in one pass over K) */
    if (isa == 3 && rowgemm_amx_spans(x, ldx, packed, bias, out, ldo, M, N, K) == 0) return;
    if (isa == 3) {
        rowgemm_amx(x, ldx, packed, bias, out, ldo, M, N, K);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < stripes; s++) {
        const uint16_t *stripe = packed + s * pairs * STRIPE * 2;
        int64_t n0 = s * STRIPE, columns = N - n0 < STRIPE ? N - n0 : STRIPE;
#if defined(__x86_64__)
        if (isa == 1) {
            stripe_avx2(x, ldx, stripe, bias, out, ldo, M, pairs, n0, columns);
            continue;
        }
        if (isa == 2) {
            stripe_avx512bf16(x, ldx, stripe, bias, out, ldo, M, pairs, n0, columns);
            continue;
        }
#endif
        stripe_scalar(x, ldx, stripe, bias, out, ldo, M, pairs, n0, columns);
    }
}

/* One row x (K even) against stripe `stripe` of a packed matrix: out[0, columns), no
 * bias, on the calling thread. The bits are those rowgemm_bf16 gives that row and those
 * columns (lmchoice.c computes the few logits it needs this way). */
void rowgemm_stripe_row(int isa, const uint16_t *x, const uint16_t *stripe, uint16_t *out, int64_t columns, int64_t K) {
    if (isa == 3 && !amx_ready()) isa = 2;
#if defined(__x86_64__)
    if (isa == 2) {
        stripe_avx512bf16(x, K, stripe, NULL, out, columns, 1, K / 2, 0, columns);
        return;
    }
    if (isa == 3) {
        stripe_amx(x, K, stripe, NULL, out, columns, 1, K / 2, 0, columns);
        return;
    }
    if (isa == 1) {
        stripe_avx2(x, K, stripe, NULL, out, columns, 1, K / 2, 0, columns);
        return;
    }
#endif
    stripe_scalar(x, K, stripe, NULL, out, columns, 1, K / 2, 0, columns);
}

/* Lay w [N, K] (row stride ldw) out in stripes (see the top of this file): out holds
 * ceil(N / STRIPE) * ceil(K / 2) * STRIPE * 2 values; rows past N and the odd K's last
 * pair half are zeros. A plain copy, parallel over stripes (torch's permute-copy of the
 * same layout ran at ~1.2 GB/s and was most of an engine's start-up). */
void rowgemm_pack(const uint16_t *w, int64_t N, int64_t K, int64_t ldw, uint16_t *out) {
    int64_t stripes = (N + STRIPE - 1) / STRIPE, pairs = (K + 1) / 2;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < stripes; s++) {
        uint16_t *stripe = out + s * pairs * STRIPE * 2;
        for (int64_t p0 = 0; p0 < pairs; p0 += 64) /* 64 pairs x 64 columns: 16 KB, in L1 */
            for (int64_t c = 0; c < STRIPE; c++) {
                int64_t n = s * STRIPE + c, end = p0 + 64 < pairs ? p0 + 64 : pairs;
                for (int64_t p = p0; p < end; p++) {
                    uint16_t *dst = stripe + stripe_at(pairs, p, c);
                    dst[0] = n < N ? w[n * ldw + 2 * p] : 0;
                    dst[1] = n < N && 2 * p + 1 < K ? w[n * ldw + 2 * p + 1] : 0;
                }
            }
    }
}

