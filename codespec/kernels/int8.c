/* Weights as int8, products with rows as int16: the arithmetic of codespec's int8 paths.
 *
 * Two users: lm_head's screen (lmchoice.c: estimates plus a bound, for the exact greedy
 * choice) and the `--quantize int8` option (every linear layer and lm_head in int8:
 * half the bytes per decode step, other output than bf16).
 *
 * Weights: int8 in stripes of whole rows of pairs, q[s][p][c][e] = q of output s * STRIPE + c,
 * input 2p + e, with one step per output: w = scale * q + e, |q| <= 127, q = round(w /
 * scale), scale = max |w| / 127 (`int8_pack`, from the bf16 stripes).
 *
 * Rows: each row of x (bf16) is cut in blocks of QB inputs; a block's values become int16
 * r with the block's own step t = max |x| / 32767 (an outlier costs its block's precision,
 * not the row's). Everything here is a function of one row and one output column:
 *   T_b = sum over the block of r_k q_k, exact in int32 (|T_b| <= 128 x 32767 x 127 < 2^31);
 *   acc = 0; for each block in order: acc = acc + float(T_b) * t_b   (float, in that order);
 *   a = acc * scale (the screen), or bf16(acc * scale + bias) (a linear layer).
 * VPDPWSSD (AVX-512 VNNI), VPMADDWD (AVX2) and the plain loop compute the same integers
 * and then the same float operations, so every path gives the same bits, and a row's bits never depend on
 * the other rows of the call: row-exact by construction, like rowgemm.c.
 */
#include <math.h>
#include <stdlib.h>

#include "bf16.h"
#include "lanes.h"

#define BLOCKS 4
#define LANES 16
#define TM 6
#define QB 128       /* inputs per row block (64 pairs) */
#define R_MAX 32767  /* int16 row values in [-32767, 32767] */
#define Q_MAX 127    /* int8 weights in [-127, 127] */

/* ---------------------------------------------------------------- packing */

typedef int8_t v16b __attribute__((vector_size(16)));

/* The int8 form of a matrix packed by rowgemm_pack ([stripes][2][pairs][STRIPE / 2][2] bf16, N
 * outputs, K padded even): q [stripes][pairs][STRIPE][2], scale, and the error terms slack and
 * qslack per output (lmchoice.c's bound; the product's own roundings included).
 * Lanes are (column, half of the pair) and a column's two lanes are merged; 16 at a time
 * (~40 ms for the default model's 136M weights on two threads, pages already touched). */
CLONES void int8_pack(const uint16_t *packed, int64_t N, int64_t K, int8_t *q, float *scale, float *slack,
                      float *qslack) {
    enum { L = STRIPE * 2, V = L / 16 };
    int64_t stripes = (N + STRIPE - 1) / STRIPE, pairs = K / 2;
    double g = (double)K * 0x1p-24 / (1.0 - (double)K * 0x1p-24); /* v's fp32 sum of K terms */
    double nb = (double)((K + QB - 1) / QB) + 2;                 /* the product's float steps */
    double h = nb * 0x1p-24 / (1.0 - nb * 0x1p-24);
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < stripes; s++) {
        const uint16_t *w = packed + s * pairs * L;
        int8_t *out = q + s * pairs * L;
        v16f most[V], step[V], inverse[V], worst[V];
        v16i total[V];
        for (int i = 0; i < V; i++) most[i] = worst[i] = (v16f){0}, total[i] = (v16i){0};
        for (int64_t p = 0; p < pairs; p++)
            for (int i = 0; i < V; i++) {
                v16f v = absolute(widen(w + stripe_at(pairs, p, 8 * i))); /* columns 8i..8i+7 */
                most[i] = pick(v > most[i], v, most[i]);
            }
        for (int i = 0; i < V; i++) { /* a column's two lanes (2c, 2c + 1) share its maximum */
            v16f swapped = __builtin_shufflevector(most[i], most[i], 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12,
                                                   15, 14);
            most[i] = pick(swapped > most[i], swapped, most[i]);
            step[i] = most[i] / (float)Q_MAX;
            inverse[i] = pick(most[i] > 0.0f, (float)Q_MAX / most[i], (v16f){0});
        }
        for (int64_t p = 0; p < pairs; p++)
            for (int i = 0; i < V; i++) {
                v16f v = widen(w + stripe_at(pairs, p, 8 * i));
                v16f r = (v * inverse[i] + 12582912.0f) - 12582912.0f; /* nearest integer (|.| < 2^22) */
                r = pick(r > (float)Q_MAX, splat(Q_MAX), r);
                r = pick(r < -(float)Q_MAX, splat(-Q_MAX), r);
                v16i n = __builtin_convertvector(r, v16i);
                v16b b = __builtin_convertvector(n, v16b);
                memcpy(out + p * L + i * 16, &b, sizeof b);
                total[i] += (n ^ (n >> 31)) - (n >> 31); /* |q| */
                v16f error = absolute(v - step[i] * r);
                worst[i] = pick(error > worst[i], error, worst[i]);
            }
        float m[L], u[L], e[L];
        int32_t t[L];
        memcpy(m, most, sizeof m), memcpy(u, step, sizeof u), memcpy(e, worst, sizeof e), memcpy(t, total, sizeof t);
        for (int c = 0; c < STRIPE && s * STRIPE + c < N; c++) {
            int64_t n = s * STRIPE + c;
            /* E: the float error of step * r (< 2^-24 of 127.5 steps) and of the difference
             * are covered by step * 2^-16; then widened by 2^-10 as every term */
            double E = (e[2 * c] > e[2 * c + 1] ? e[2 * c] : e[2 * c + 1]) + u[2 * c] * 0x1p-16;
            scale[n] = u[2 * c];
            slack[n] = (float)((E + g * m[2 * c] + h * Q_MAX * u[2 * c]) * (1.0 + 0x1p-10));
            qslack[n] = (float)((double)u[2 * c] * (double)(t[2 * c] + t[2 * c + 1]) * (1.0 + h) * (1.0 + 0x1p-10));
        }
    }
}

/* ---------------------------------------------------------------- rows to int16 */

/* Row x (K bf16, K even) as int16 r [K] with a step per block t [ceil(K / QB)]. Returns
 * D = max |x_k - t_b r_k| over the row (exact, in double) and sets *spread to X = sum
 * |x_k| (rounded up); -1 for a row with a non-finite value (then r = 0, t = 1). */
double int8_row(const uint16_t *x, int64_t K, int16_t *r, float *t, float *spread) {
    double sum = 0.0, worst = 0.0;
    for (int64_t b0 = 0, b = 0; b0 < K; b0 += QB, b++) {
        int64_t end = b0 + QB < K ? b0 + QB : K;
        float top = 0.0f;
        for (int64_t k = b0; k < end; k++) {
            float v = fabsf(bf16_to_f32(x[k]));
            if (!(v <= 3.4e38f)) { /* NaN or infinity */
                memset(r, 0, (size_t)K * sizeof *r);
                for (int64_t i = 0; i < (K + QB - 1) / QB; i++) t[i] = 1.0f;
                *spread = 0.0f;
                return -1.0;
            }
            top = v > top ? v : top;
            sum += v; /* values of 8 significant bits: exact in double until far past any K */
        }
        t[b] = top > 0 ? top / (float)R_MAX : 1.0f;
        for (int64_t k = b0; k < end; k++) {
            float v = bf16_to_f32(x[k]), n = nearbyintf(v / t[b]);
            n = n > R_MAX ? R_MAX : (n < -R_MAX ? -R_MAX : n);
            r[k] = (int16_t)n;
            double d = fabs((double)v - (double)t[b] * (double)n); /* exact: 24 + 15 bits */
            worst = d > worst ? d : worst;
        }
    }
    *spread = (float)(sum * (1.0 + 0x1p-10));
    return worst;
}

/* ---------------------------------------------------------------- the product */

/* What a call writes: float estimates (the screen) or bf16 outputs with a bias (a layer) */
typedef struct {
    float *estimates;     /* [M, N] (row stride ldo), or NULL */
    uint16_t *out;        /* [M, N] bf16 (row stride ldo), when estimates is NULL */
    const uint16_t *bias; /* [N] bf16 or NULL */
    int64_t ldo;
} Sink;

static inline void emit(const Sink *sink, int64_t m, int64_t n, float acc, float scale) {
    float a = acc * scale;
    if (sink->estimates) {
        sink->estimates[m * sink->ldo + n] = a;
        return;
    }
    if (sink->bias) a = a + bf16_to_f32(sink->bias[n]);
    sink->out[m * sink->ldo + n] = f32_to_bf16(a);
}

static void product_scalar(const int16_t *r, const float *t, int64_t K, const int8_t *stripe, const float *scale,
                           const Sink *sink, int64_t M, int64_t n0, int64_t columns) {
    int64_t blocks = (K + QB - 1) / QB;
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < columns; c++) {
            const int16_t *rr = r + m * K;
            float acc = 0.0f;
            for (int64_t b = 0; b < blocks; b++) {
                int32_t sum = 0;
                for (int64_t p = b * QB / 2; p < (b + 1) * QB / 2 && 2 * p < K; p++) {
                    const int8_t *wp = stripe + (p * STRIPE + c) * 2;
                    sum += rr[2 * p] * wp[0] + rr[2 * p + 1] * wp[1];
                }
                acc = acc + (float)sum * t[m * blocks + b];
            }
            emit(sink, m, n0 + c, acc, scale[n0 + c]);
        }
}

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define INLINE inline __attribute__((always_inline))

/* acc += pairwise int16 products (VPDPWSSD). Spelled in asm: GCC 12's intrinsic copies
 * every accumulator around each use (3x the instructions, measured). */
AVX512VNNI static INLINE __m512i dpwssd(__m512i acc, __m512i x, __m512i w) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
    return acc;
}

/* Rows m0..m0+mt-1 against one stripe; the integer sums of a block stay in registers,
 * the float accumulators in `acc` (L1). `mt` is a constant at every call. */
AVX512VNNI static INLINE void product_tile(const int16_t *r, const float *t, int64_t K, const int8_t *stripe,
                                           const float *scale, const Sink *sink, int64_t m0, const int mt,
                                           int64_t n0, int64_t columns) {
    int64_t blocks = (K + QB - 1) / QB;
    __m512 acc[TM][BLOCKS];
    for (int i = 0; i < mt; i++)
        for (int c = 0; c < BLOCKS; c++) acc[i][c] = _mm512_setzero_ps();
    const int8_t *wp = stripe;
    for (int64_t b = 0; b < blocks; b++) {
        __m512i sum[TM][BLOCKS];
        for (int i = 0; i < mt; i++)
            for (int c = 0; c < BLOCKS; c++) sum[i][c] = _mm512_setzero_si512();
        int64_t end = (b + 1) * QB / 2 < K / 2 ? (b + 1) * QB / 2 : K / 2;
        for (int64_t p = b * QB / 2; p < end; p++, wp += STRIPE * 2) {
            __m512i wv[BLOCKS]; /* 16 columns x one pair: 32 int8 -> 32 int16 */
            for (int c = 0; c < BLOCKS; c++)
                wv[c] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wp + c * LANES * 2)));
            for (int i = 0; i < mt; i++) {
                int32_t pair;
                memcpy(&pair, r + (m0 + i) * K + 2 * p, sizeof pair);
                __m512i xv = _mm512_set1_epi32(pair);
                for (int c = 0; c < BLOCKS; c++) sum[i][c] = dpwssd(sum[i][c], xv, wv[c]);
            }
        }
        for (int i = 0; i < mt; i++) {
            __m512 step = _mm512_set1_ps(t[(m0 + i) * blocks + b]);
            for (int c = 0; c < BLOCKS; c++)
                acc[i][c] = _mm512_add_ps(acc[i][c], _mm512_mul_ps(_mm512_cvtepi32_ps(sum[i][c]), step));
        }
    }
    for (int c = 0; c < BLOCKS; c++) {
        int64_t c0 = c * LANES;
        if (c0 >= columns) break;
        float lanes[LANES];
        for (int i = 0; i < mt; i++) {
            _mm512_storeu_ps(lanes, acc[i][c]);
            for (int l = 0; l < LANES && c0 + l < columns; l++) emit(sink, m0 + i, n0 + c0 + l, lanes[l], scale[n0 + c0 + l]);
        }
    }
}

/* ---------------------------------------------------------------- AVX2 (isa 1)
 *
 * The same integers by VPMADDWD (a pair's two int16 x int16 products summed in int32,
 * exact) and VPADDD, then the same float steps: the bits of the plain loop and of VNNI.
 * Rows m0..m0+mt-1 against 8-lane column blocks b0, b0+1 of one stripe. */

#define AVX2 __attribute__((target("avx2")))
#define TM2 5 /* rows a tile: 2 x TM2 integer sums, 2 weights, a broadcast in 16 registers */

AVX2 static INLINE void product_tile_avx2(const int16_t *r, const float *t, int64_t K, const int8_t *stripe,
                                          const float *scale, const Sink *sink, int64_t m0, const int mt, int b0,
                                          int64_t n0, int64_t columns) {
    int64_t blocks = (K + QB - 1) / QB;
    __m256 acc[TM2][2];
    for (int i = 0; i < mt; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const int8_t *wp = stripe + b0 * 8 * 2;
    for (int64_t b = 0; b < blocks; b++) {
        __m256i sum[TM2][2];
        for (int i = 0; i < mt; i++) sum[i][0] = sum[i][1] = _mm256_setzero_si256();
        int64_t end = (b + 1) * QB / 2 < K / 2 ? (b + 1) * QB / 2 : K / 2;
        for (int64_t p = b * QB / 2; p < end; p++, wp += STRIPE * 2) {
            __m256i wv[2]; /* 8 columns x one pair: 16 int8 -> 16 int16 */
            for (int c = 0; c < 2; c++) wv[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wp + c * 16)));
            for (int i = 0; i < mt; i++) {
                int32_t pair;
                memcpy(&pair, r + (m0 + i) * K + 2 * p, sizeof pair);
                __m256i xv = _mm256_set1_epi32(pair);
                for (int c = 0; c < 2; c++) sum[i][c] = _mm256_add_epi32(sum[i][c], _mm256_madd_epi16(xv, wv[c]));
            }
        }
        for (int i = 0; i < mt; i++) {
            __m256 step = _mm256_set1_ps(t[(m0 + i) * blocks + b]);
            for (int c = 0; c < 2; c++)
                acc[i][c] = _mm256_add_ps(acc[i][c], _mm256_mul_ps(_mm256_cvtepi32_ps(sum[i][c]), step));
        }
    }
    for (int c = 0; c < 2; c++) {
        int64_t c0 = (b0 + c) * 8;
        if (c0 >= columns) break;
        float lanes[8];
        for (int i = 0; i < mt; i++) {
            _mm256_storeu_ps(lanes, acc[i][c]);
            for (int l = 0; l < 8 && c0 + l < columns; l++) emit(sink, m0 + i, n0 + c0 + l, lanes[l], scale[n0 + c0 + l]);
        }
    }
}

AVX2 static void product_avx2(const int16_t *r, const float *t, int64_t K, const int8_t *stripe, const float *scale,
                              const Sink *sink, int64_t M, int64_t n0, int64_t columns) {
    for (int b0 = 0; b0 < 8 && b0 * 8 < columns; b0 += 2) /* 16 columns: 32 bytes of each pair's row */
        for (int64_t m = 0; m < M; m += TM2) {
            switch (M - m < TM2 ? M - m : TM2) {
            case 1: product_tile_avx2(r, t, K, stripe, scale, sink, m, 1, b0, n0, columns); break;
            case 2: product_tile_avx2(r, t, K, stripe, scale, sink, m, 2, b0, n0, columns); break;
            case 3: product_tile_avx2(r, t, K, stripe, scale, sink, m, 3, b0, n0, columns); break;
            case 4: product_tile_avx2(r, t, K, stripe, scale, sink, m, 4, b0, n0, columns); break;
            default: product_tile_avx2(r, t, K, stripe, scale, sink, m, TM2, b0, n0, columns); break;
            }
        }
}

AVX512VNNI static void product_vnni(const int16_t *r, const float *t, int64_t K, const int8_t *stripe,
                                    const float *scale, const Sink *sink, int64_t M, int64_t n0, int64_t columns) {
    for (int64_t m = 0; m < M; m += TM) {
        switch (M - m < TM ? M - m : TM) {
        case 1: product_tile(r, t, K, stripe, scale, sink, m, 1, n0, columns); break;
        case 2: product_tile(r, t, K, stripe, scale, sink, m, 2, n0, columns); break;
        case 3: product_tile(r, t, K, stripe, scale, sink, m, 3, n0, columns); break;
        case 4: product_tile(r, t, K, stripe, scale, sink, m, 4, n0, columns); break;
        case 5: product_tile(r, t, K, stripe, scale, sink, m, 5, n0, columns); break;
        default: product_tile(r, t, K, stripe, scale, sink, m, 6, n0, columns); break;
        }
    }
}
#endif

/* The path this CPU runs: 2 (AVX-512 VNNI), 1 (AVX2) or 0 (the plain loop), at most `cap`. */
int int8_isa(int cap) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (cap >= 2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) return 2;
    if (cap >= 1 && __builtin_cpu_supports("avx2")) return 1;
#endif
    (void)cap;
    return 0;
}

static void product(int isa, const int16_t *r, const float *t, int64_t K, const int8_t *q, const float *scale,
                    const Sink *sink, int64_t M, int64_t N) {
    int64_t stripes = (N + STRIPE - 1) / STRIPE;
    int fast = int8_isa(isa);
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < stripes; s++) {
        const int8_t *stripe = q + s * (K / 2) * STRIPE * 2;
        int64_t n0 = s * STRIPE, columns = N - n0 < STRIPE ? N - n0 : STRIPE;
#if defined(__x86_64__)
        if (fast == 2) {
            product_vnni(r, t, K, stripe, scale, sink, M, n0, columns);
            continue;
        }
        if (fast == 1) {
            product_avx2(r, t, K, stripe, scale, sink, M, n0, columns);
            continue;
        }
#endif
        (void)fast;
        product_scalar(r, t, K, stripe, scale, sink, M, n0, columns);
    }
}

/* Estimates a [M, N] (row stride ldo) of rows already cut by int8_row: r [M, K], t [M,
 * ceil(K / QB)]. */
void int8_estimates(int isa, const int16_t *r, const float *t, int64_t K, const int8_t *q, const float *scale,
                    float *a, int64_t ldo, int64_t M, int64_t N) {
    Sink sink = {a, NULL, NULL, ldo};
    product(isa, r, t, K, q, scale, &sink, M, N);
}

/* A linear layer in int8: out [M, N] = bf16(x . (scale * q) + bias) for rows x [M, K]
 * (bf16, row stride ldx, K even). Returns 0, or -1 when out of memory. */
int int8_linear(int isa, const uint16_t *x, int64_t ldx, const int8_t *q, const float *scale, const uint16_t *bias,
                uint16_t *out, int64_t ldo, int64_t M, int64_t N, int64_t K) {
    int64_t blocks = (K + QB - 1) / QB;
    int16_t *r = malloc((size_t)(M * K) * sizeof *r);
    float *t = malloc((size_t)(M * blocks) * sizeof *t);
    if (!r || !t) {
        free(r);
        free(t);
        return -1;
    }
    float spread;
    for (int64_t m = 0; m < M; m++) int8_row(x + m * ldx, K, r + m * K, t + m * blocks, &spread);
    Sink sink = {NULL, out, bias, ldo};
    product(isa, r, t, K, q, scale, &sink, M, N);
    free(r);
    free(t);
    return 0;
}
