/* rowdecoder.c's attention for rowgemm's AVX2 path (isa 1): one row's query heads of one
 * KV head against the row's keys, in 8-lane AVX2 + FMA.
 *
 * Why its own code: rowdecoder.c's `attend` is written in 16-lane vectors for AVX-512.
 * Compiled for AVX2 (16 registers of 8 lanes) it kept spilling its queries and partial
 * sums to the stack: on the AVX2 EPYC VM it was a third of a 783-token prefill, where
 * its arithmetic is ~1% of the products'.
 *
 * The contract is the same: a row's output depends on its own keys alone, in the order
 * decoding sees them (the slot's first `context` keys, then its `path`), so a verify
 * pass's row gets the bits of its decode step. Here, for each head:
 *   - score of key j: lane l takes dims l, l+8, l+16, ... in order (a multiply, then
 *     FMAs), then the 8 lanes in a fixed tree ((0+1)+(2+3))+((4+5)+(6+7)), whichever
 *     of the 8 keys reduced together j is; times `scale`;
 *   - the max, e^(s - max) (Cephes' polynomial, as rowdecoder.c), their sum in 8 lanes
 *     over j in order, then the same fixed tree;
 *   - the weighted values summed over j in order (an FMA each), divided by the sum,
 *     rounded to bf16.
 * Batching heads or dims changes no sum. The bits differ from `attend`'s (another
 * summation): a machine runs one path.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "lanes.h" /* EXP_*: exp16's constants */

#define AVX2 __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))
#define L8 8                /* lanes */
#define SCORE_HEADS 8       /* heads scored at once: 8 partial sums + a key chunk in registers */
#define WEIGH_HEADS 3       /* heads weighed at once over 32 dims: 12 sums, a value chunk, a weight */
#define KEY(j) ((j) < context ? (j) : path[(j) - context]) /* slot position of the row's j-th key */

AVX2 INLINE __m256 widen8(const uint16_t *p) { /* 8 bf16 -> fp32, exact */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* 8 vectors (one per key) -> the vector of their 8 lane sums, each in the same tree */
AVX2 INLINE __m256 reduce8(const __m256 *v) {
    __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
    __m256 c = _mm256_hadd_ps(v[4], v[5]), d = _mm256_hadd_ps(v[6], v[7]);
    __m256 lo = _mm256_hadd_ps(a, b), hi = _mm256_hadd_ps(c, d); /* keys 0-3 | 4-7, lanes 0-3 and 4-7 apart */
    return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

AVX2 INLINE float sum8(__m256 v) { /* the same tree as reduce8 gives lane 0 */
    __m256 h = _mm256_hadd_ps(v, v);
    h = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

/* e^x, rowdecoder.c's exp16 in 8 lanes (lanes.h's constants; no FMA: mul, then add) */
AVX2 INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(EXP_MAX));
    x = _mm256_max_ps(x, _mm256_set1_ps(EXP_MIN));
    __m256 fx = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), _mm256_set1_ps(0.5f));
    __m256 whole = _mm256_floor_ps(fx);
    x = _mm256_sub_ps(x, _mm256_mul_ps(whole, _mm256_set1_ps(EXP_LN2_HI)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(whole, _mm256_set1_ps(EXP_LN2_LO)));
    __m256 z = _mm256_mul_ps(x, x), y = _mm256_set1_ps(EXP_POLY[0]);
    for (int i = 1; i < EXP_TERMS; i++) y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(EXP_POLY[i]));
    y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, z), x), _mm256_set1_ps(1.0f));
    __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(whole), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

/* scores[h][j] for heads h0..h0+hb-1: 8 keys at a time, lanes over dims */
AVX2 static void score(const float *qf, const uint16_t *keys, int64_t context, const int64_t *path, int64_t n,
                       int64_t padded, int64_t h0, int hb, int64_t dim, float scale, float *scores) {
    __m256 parts[SCORE_HEADS][L8];
    for (int64_t j0 = 0; j0 < padded; j0 += L8) {
        for (int l = 0; l < L8; l++) {
            __m256 acc[SCORE_HEADS];
            for (int h = 0; h < hb; h++) acc[h] = _mm256_setzero_ps();
            if (j0 + l < n) {
                const uint16_t *k = keys + KEY(j0 + l) * dim;
                __m256 kf = widen8(k);
                for (int h = 0; h < hb; h++) acc[h] = _mm256_mul_ps(kf, _mm256_loadu_ps(qf + (h0 + h) * dim));
                for (int64_t c = L8; c < dim; c += L8) {
                    kf = widen8(k + c);
                    for (int h = 0; h < hb; h++) acc[h] = _mm256_fmadd_ps(kf, _mm256_loadu_ps(qf + (h0 + h) * dim + c), acc[h]);
                }
            }
            for (int h = 0; h < hb; h++) parts[h][l] = acc[h];
        }
        for (int h = 0; h < hb; h++)
            _mm256_storeu_ps(scores + (h0 + h) * padded + j0, _mm256_mul_ps(reduce8(parts[h]), _mm256_set1_ps(scale)));
    }
}

/* acc[h][d0 .. d0+32) = sum over j < n, in order, of p[h][j] * v_j[d0 .. d0+32) for heads h0..h0+hb-1 */
AVX2 static void weigh(const float *p, const uint16_t *values, int64_t context, const int64_t *path, int64_t n,
                       int64_t padded, int64_t h0, int hb, int64_t dim, int64_t d0, float *acc) {
    __m256 sum[WEIGH_HEADS][4];
    for (int h = 0; h < hb; h++)
        for (int c = 0; c < 4; c++) sum[h][c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *v = values + KEY(j) * dim + d0;
        for (int c = 0; c < 4; c++) {
            __m256 vf = widen8(v + c * L8);
            for (int h = 0; h < hb; h++)
                sum[h][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (h0 + h) * padded + j), vf, sum[h][c]);
        }
    }
    for (int h = 0; h < hb; h++)
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(acc + (h0 + h) * dim + d0 + c * L8, sum[h][c]);
}

/* Arguments as rowdecoder.c's `attend` (dim 64 or 128), and a scratch of group * (keys
 * rounded up to 16 + 2 * dim + 1) floats: scores, sums of values, widened queries, and
 * each head's sum of exponentials. */
AVX2 void attend_avx2(const uint16_t *q, uint16_t *out, const uint16_t *keys, const uint16_t *values,
                      int64_t context, const int64_t *path, int64_t path_len, int64_t group, int64_t dim,
                      float scale, float *scratch) {
    int64_t n = context + path_len, padded = (n + L8 - 1) / L8 * L8;
    float *scores = scratch, *acc = scratch + group * padded, *qf = acc + group * dim;
    for (int64_t i = 0; i < group * dim; i++) qf[i] = bf16_to_f32(q[i]);
    for (int64_t h0 = 0; h0 < group; h0 += SCORE_HEADS) {
        int hb = group - h0 < SCORE_HEADS ? (int)(group - h0) : SCORE_HEADS;
        score(qf, keys, context, path, n, padded, h0, hb, dim, scale, scores);
    }
    float *sums = qf + group * dim;
    for (int64_t h = 0; h < group; h++) {
        float *s = scores + h * padded;
        for (int64_t j = n; j < padded; j++) s[j] = -INFINITY; /* keys past the row's: nothing */
        __m256 top = _mm256_set1_ps(-INFINITY);
        for (int64_t j = 0; j < padded; j += L8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j));
        float t[L8], best = -INFINITY;
        _mm256_storeu_ps(t, top);
        for (int l = 0; l < L8; l++) best = t[l] > best ? t[l] : best;
        __m256 total = _mm256_setzero_ps(), minus = _mm256_set1_ps(best);
        for (int64_t j = 0; j < padded; j += L8) {
            __m256 v = _mm256_loadu_ps(s + j);
            __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ),
                                        exp8(_mm256_sub_ps(v, minus)));
            _mm256_storeu_ps(s + j, e);
            total = _mm256_add_ps(total, e);
        }
        sums[h] = sum8(total);
    }
    for (int64_t h0 = 0; h0 < group; h0 += WEIGH_HEADS) {
        int hb = group - h0 < WEIGH_HEADS ? (int)(group - h0) : WEIGH_HEADS;
        for (int64_t d0 = 0; d0 < dim; d0 += 4 * L8) weigh(scores, values, context, path, n, padded, h0, hb, dim, d0, acc);
    }
    for (int64_t h = 0; h < group; h++)
        for (int64_t d = 0; d < dim; d++) out[h * dim + d] = f32_to_bf16(acc[h * dim + d] / sums[h]);
}
