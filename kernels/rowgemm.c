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
 * Weights are packed once (rowgemm.py `pack`) into stripes of STRIPE output columns:
 *   packed[s][p][c][e] = w[s * STRIPE + c, 2 * p + e]   (zero-padded to whole stripes, even K)
 * so one 64-byte load holds 16 columns x one pair of k, and a stripe is one sequential
 * stream (a decode step reads the weights at memory speed: ~26 GB/s on the 2-core EPYC
 * VM, where oneDNN's two-row GEMM reads ~16 GB/s).
 *
 * The dot product (`rowgemm_isa` == 2, AVX-512 BF16): lane c of an fp32 accumulator
 * takes pair p = 0, 1, 2, ... in order, one VDPBF16PS each (x's pair broadcast), then the
 * bias, then one rounding to bf16 (VCVTNEPS2BF16, nearest even). Nothing crosses lanes,
 * so a row's sums do not depend on the other rows in its tile or on the tile's size.
 * `rowgemm_isa` == 0 is a scalar loop over the same layout (any CPU: tests, and the
 * reference of the contract; the engine does not use it for speed). Threads split the
 * stripes with OpenMP; the library links libgomp.so.1, which resolves to torch's copy.
 *
 * Layouts: x [M, K] bf16 (row stride ldx, K even), packed as above, bias [N] bf16 or
 * NULL, out [M, N] bf16 (row stride ldo). bf16 travels as uint16_t.
 */
#include "bf16.h"

#define STRIPE 64 /* output columns per stripe: BLOCKS x 16 fp32 lanes */
#define BLOCKS 4
#define LANES 16
#define TM 6 /* rows of x per tile: TM x BLOCKS accumulators + BLOCKS + 1 in 32 registers */

/* ---------------------------------------------------------------- scalar (isa 0) */

static void stripe_scalar(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias,
                          uint16_t *out, int64_t ldo, int64_t M, int64_t pairs, int64_t n0, int64_t columns) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < columns; c++) {
            const uint16_t *xr = x + m * ldx;
            float sum = 0.0f;
            for (int64_t p = 0; p < pairs; p++) {
                const uint16_t *wp = stripe + (p * STRIPE + c) * 2;
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

/* Rows m0..m0+mt-1 against one stripe. `mt` is a constant at every call (the switch
 * below), so the accumulators stay in registers. */
AVX512BF16 static INLINE void tile(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias,
                                   uint16_t *out, int64_t ldo, int64_t pairs, int64_t m0, const int mt, int64_t n0,
                                   int64_t columns) {
    __m512 acc[TM][BLOCKS];
    for (int i = 0; i < mt; i++)
        for (int b = 0; b < BLOCKS; b++) acc[i][b] = _mm512_setzero_ps();
    const uint16_t *xr[TM];
    for (int i = 0; i < mt; i++) xr[i] = x + (m0 + i) * ldx;
    const uint16_t *wp = stripe;
    for (int64_t p = 0; p < pairs; p++, wp += STRIPE * 2) {
        __m512bh wv[BLOCKS];
        for (int b = 0; b < BLOCKS; b++) wv[b] = (__m512bh)_mm512_loadu_si512(wp + b * LANES * 2);
        for (int i = 0; i < mt; i++) {
            int32_t pair;
            memcpy(&pair, xr[i] + 2 * p, sizeof pair);
            __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            for (int b = 0; b < BLOCKS; b++) acc[i][b] = _mm512_dpbf16_ps(acc[i][b], xv, wv[b]);
        }
    }
    for (int b = 0; b < BLOCKS; b++) {
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

AVX512BF16 static void stripe_avx512bf16(const uint16_t *x, int64_t ldx, const uint16_t *stripe,
                                         const uint16_t *bias, uint16_t *out, int64_t ldo, int64_t M, int64_t pairs,
                                         int64_t n0, int64_t columns) {
    for (int64_t m = 0; m < M; m += TM) {
        switch (M - m < TM ? M - m : TM) {
        case 1: tile(x, ldx, stripe, bias, out, ldo, pairs, m, 1, n0, columns); break;
        case 2: tile(x, ldx, stripe, bias, out, ldo, pairs, m, 2, n0, columns); break;
        case 3: tile(x, ldx, stripe, bias, out, ldo, pairs, m, 3, n0, columns); break;
        case 4: tile(x, ldx, stripe, bias, out, ldo, pairs, m, 4, n0, columns); break;
        case 5: tile(x, ldx, stripe, bias, out, ldo, pairs, m, 5, n0, columns); break;
        default: tile(x, ldx, stripe, bias, out, ldo, pairs, m, 6, n0, columns); break;
        }
    }
}
#endif

/* The path this CPU runs: 2 (AVX-512 BF16) or 0 (scalar), at most `cap`. */
int rowgemm_isa(int cap) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (cap >= 2 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")) return 2;
#endif
    (void)cap;
    return 0;
}

int rowgemm_stripe(void) { return STRIPE; }

/* K is the padded (even) length: packed holds K / 2 pairs a column. */
void rowgemm_bf16(int isa, const uint16_t *x, int64_t ldx, const uint16_t *packed, const uint16_t *bias, uint16_t *out,
                  int64_t ldo, int64_t M, int64_t N, int64_t K) {
    int64_t stripes = (N + STRIPE - 1) / STRIPE, pairs = K / 2;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < stripes; s++) {
        const uint16_t *stripe = packed + s * pairs * STRIPE * 2;
        int64_t n0 = s * STRIPE, columns = N - n0 < STRIPE ? N - n0 : STRIPE;
#if defined(__x86_64__)
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
#if defined(__x86_64__)
    if (isa == 2) {
        stripe_avx512bf16(x, K, stripe, NULL, out, columns, 1, K / 2, 0, columns);
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
                    uint16_t *dst = stripe + (p * STRIPE + c) * 2;
                    dst[0] = n < N ? w[n * ldw + 2 * p] : 0;
                    dst[1] = n < N && 2 * p + 1 < K ? w[n * ldw + 2 * p + 1] : 0;
                }
            }
    }
}

