/* Greedy choices without reading all of lm_head: an int8 screen, then the exact logits
 * of the few tokens it cannot rule out.
 *
 * A greedy row needs only the argmax of lm_head's bf16 logits (the first maximum, as
 * torch.argmax takes it). The default model's lm_head is 136M bf16 weights: 272 MB,
 * 27% of the bytes a decode step reads, and a CPU decode step is bound by the bytes
 * it reads. The screen holds the same matrix as int8 with one scale per output
 * (136 MB) and gives each token j an approximate logit a_j and a bound B_j such that
 * the exact fp32 sum v_j that rowgemm computes lies in [a_j - B_j, a_j + B_j], whatever
 * the rounding. A token whose upper end is below the best lower end, less two bf16
 * steps for the final rounding, cannot be the argmax. The rest (measured on the
 * default model: median 2, at most 24 of 151,936) get their exact logits from the
 * same rowgemm stripes, computed as the full product computes them (a lane's sum never
 * depends on the other lanes: rowgemm.c), and the first maximum among them is the
 * choice. So the choice is the full product's argmax by construction, on any CPU:
 * no tolerance decides a token.
 *
 * The screen's arithmetic is integer: the row x is scaled to int16 (r_k, step t, so
 * x_k = t r_k + d_k) and each output's weights to int8 (q_k, step s, w_k = s q_k + e_k);
 * T = sum r_k q_k is exact in int32 (|r_k| is capped so that it cannot overflow), by
 * VPDPWSSD on AVX-512 VNNI or a plain loop, which give the same T. a = fl(fl(T) s t).
 *
 * The bound, for output j, K inputs, X = sum |x_k|, D = max |d_k|:
 *   S = sum x_k w_k (real); v = fl(S) as rowgemm sums it: |v - S| <= g M X, where
 *       g = K u / (1 - K u), u = 2^-24, M = max |w_k| (recursive summation of exact
 *       products: a product of two bf16 is exact in fp32);
 *   S - s t T = sum x_k e_k + s sum d_k q_k, so |S - s t T| <= E X + s Q D, where
 *       E = max |e_k| and Q = sum |q_k| (both measured exactly at packing);
 *   |a - s t T| <= 3 u |a| (three roundings).
 * So |v - a| <= (E + g M) X + (s Q) D + 3 u |a|: `slack` holds E + g M and `qslack`
 * s Q, both widened by 2^-10 (which also covers the float arithmetic of the bound
 * itself), and the bound takes 2^-20 |a| for 3 u |a| and 1e-20 for the subnormals
 * VDPBF16PS flushes. The final rounding to bf16 is monotone and moves a value by at
 * most 2^-8 of it, so the argmax's v is at least best_lower - 2^-7 |best_lower|; the
 * screen keeps every j whose upper end reaches best_lower - 2^-6 |best_lower|.
 *
 * Layout: the screen is rowgemm's stripe layout in int8: q[s][p][c][e] = q of output
 * s * STRIPE + c, input 2p + e (zero padded), with scale, slack and qslack per output.
 */
#include <math.h>
#include <stdlib.h>

#include "bf16.h"

#define STRIPE 64
#define BLOCKS 4
#define LANES 16
#define TM 6
#define ROUNDING_SLACK (1.0f / 64.0f) /* two bf16 steps, relative */
#define ABSOLUTE_SLACK 1e-20f         /* subnormals flushed by VDPBF16PS, a few per sum at most */
#define Q_MAX 127                     /* int8 weights in [-127, 127] */

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define CLONES
#endif

/* ---------------------------------------------------------------- packing */

typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef int8_t v16b __attribute__((vector_size(16)));

static inline v16f widen16(const uint16_t *p) { /* 16 bf16 -> fp32, exact */
    v16h h;
    memcpy(&h, p, sizeof h);
    return (v16f)(__builtin_convertvector(h, v16u) << 16);
}

static inline v16f choose16(v16i mask, v16f yes, v16f no) { return (v16f)(((v16i)yes & mask) | ((v16i)no & ~mask)); }

static inline v16f abs16(v16f v) { return (v16f)((v16i)v & 0x7fffffff); }

/* The screen of a matrix packed by rowgemm_pack ([stripes][pairs][STRIPE][2] bf16, N
 * outputs, K padded even): q in the same layout, scale, slack and qslack per output.
 * Lanes are (column, half of the pair) and a column's two lanes are merged; 16 at a time
 * (~0.1 s for the default model's 136M weights on two threads). */
CLONES void lmchoice_pack(const uint16_t *packed, int64_t N, int64_t K, int8_t *q, float *scale, float *slack,
                          float *qslack) {
    enum { L = STRIPE * 2, V = L / 16 };
    int64_t stripes = (N + STRIPE - 1) / STRIPE, pairs = K / 2;
    double g = (double)K * 0x1p-24 / (1.0 - (double)K * 0x1p-24);
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < stripes; s++) {
        const uint16_t *w = packed + s * pairs * L;
        int8_t *out = q + s * pairs * L;
        v16f most[V], step[V], inverse[V], worst[V];
        v16i total[V];
        for (int i = 0; i < V; i++) most[i] = worst[i] = (v16f){0}, total[i] = (v16i){0};
        for (int64_t p = 0; p < pairs; p++)
            for (int i = 0; i < V; i++) {
                v16f v = abs16(widen16(w + p * L + i * 16));
                most[i] = choose16(v > most[i], v, most[i]);
            }
        for (int i = 0; i < V; i++) { /* a column's two lanes (2c, 2c + 1) share its maximum */
            v16f swapped = __builtin_shufflevector(most[i], most[i], 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12,
                                                   15, 14);
            most[i] = choose16(swapped > most[i], swapped, most[i]);
            step[i] = most[i] / (float)Q_MAX;
            inverse[i] = choose16(most[i] > 0.0f, (float)Q_MAX / most[i], (v16f){0});
        }
        for (int64_t p = 0; p < pairs; p++)
            for (int i = 0; i < V; i++) {
                v16f v = widen16(w + p * L + i * 16);
                v16f r = (v * inverse[i] + 12582912.0f) - 12582912.0f; /* nearest integer (|.| < 2^22) */
                r = choose16(r > (float)Q_MAX, (v16f){0} + Q_MAX, r);
                r = choose16(r < -(float)Q_MAX, (v16f){0} - Q_MAX, r);
                v16i n = __builtin_convertvector(r, v16i);
                v16b b = __builtin_convertvector(n, v16b);
                memcpy(out + p * L + i * 16, &b, sizeof b);
                total[i] += (n ^ (n >> 31)) - (n >> 31); /* |q| */
                v16f error = abs16(v - step[i] * r);
                worst[i] = choose16(error > worst[i], error, worst[i]);
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
            slack[n] = (float)((E + g * m[2 * c]) * (1.0 + 0x1p-10));
            qslack[n] = (float)((double)u[2 * c] * (double)(t[2 * c] + t[2 * c + 1]) * (1.0 + 0x1p-10));
        }
    }
}

/* ---------------------------------------------------------------- rows to int16 */

/* The largest |r_k| for which sum r_k q_k fits int32 over K inputs (at most 16 bits). */
static int32_t r_cap(int64_t K) {
    int64_t cap = 2147483647LL / (Q_MAX * (K > 0 ? K : 1));
    return (int32_t)(cap < 32767 ? cap : 32767);
}

/* Row x (K bf16) as int16 r with step t; returns D = max |x_k - t r_k| (exact, in
 * double) and sets *t and *spread (X = sum |x_k|, rounded up), or -1 for a row with a
 * non-finite value. */
static double quantize_row(const uint16_t *x, int64_t K, int16_t *r, float *t, float *spread) {
    double top = 0.0, sum = 0.0, worst = 0.0;
    for (int64_t k = 0; k < K; k++) {
        double v = fabs((double)bf16_to_f32(x[k]));
        if (!(v <= 3.4e38)) return -1.0; /* NaN or infinity */
        top = v > top ? v : top;
        sum += v; /* values of 8 significant bits: exact in double until far past any K */
    }
    int32_t cap = r_cap(K);
    *t = top > 0 ? (float)(top / cap) : 1.0f;
    *spread = (float)(sum * (1.0 + 0x1p-10));
    double step = *t;
    for (int64_t k = 0; k < K; k++) {
        double v = bf16_to_f32(x[k]), n = nearbyint(v / step);
        n = n > cap ? cap : (n < -cap ? -cap : n);
        r[k] = (int16_t)n;
        double d = fabs(v - step * n); /* exact: step * n has <= 40 significant bits */
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* ---------------------------------------------------------------- the screen: a = s t (r . q) */

static void screen_scalar(const int16_t *r, int64_t K, const int8_t *stripe, const float *scale, const float *t,
                          float *out, int64_t ldo, int64_t M, int64_t n0, int64_t columns) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t c = 0; c < columns; c++) {
            const int16_t *rr = r + m * K;
            int32_t sum = 0;
            for (int64_t p = 0; p < K / 2; p++) {
                const int8_t *wp = stripe + (p * STRIPE + c) * 2;
                sum += rr[2 * p] * wp[0] + rr[2 * p + 1] * wp[1];
            }
            out[m * ldo + n0 + c] = ((float)sum * scale[n0 + c]) * t[m];
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

AVX512VNNI static INLINE void screen_tile(const int16_t *r, int64_t K, const int8_t *stripe, const float *scale,
                                          const float *t, float *out, int64_t ldo, int64_t m0, const int mt,
                                          int64_t n0, int64_t columns) {
    __m512i acc[TM][BLOCKS];
    for (int i = 0; i < mt; i++)
        for (int b = 0; b < BLOCKS; b++) acc[i][b] = _mm512_setzero_si512();
    const int8_t *wp = stripe;
    for (int64_t p = 0; p < K / 2; p++, wp += STRIPE * 2) {
        __m512i wv[BLOCKS]; /* 16 columns x one pair: 32 int8 -> 32 int16 */
        for (int b = 0; b < BLOCKS; b++)
            wv[b] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wp + b * LANES * 2)));
        for (int i = 0; i < mt; i++) {
            int32_t pair;
            memcpy(&pair, r + (m0 + i) * K + 2 * p, sizeof pair);
            __m512i xv = _mm512_set1_epi32(pair);
            for (int b = 0; b < BLOCKS; b++) acc[i][b] = dpwssd(acc[i][b], xv, wv[b]);
        }
    }
    for (int b = 0; b < BLOCKS; b++) {
        int64_t c0 = b * LANES;
        if (c0 >= columns) break;
        __mmask16 keep = columns - c0 >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << (columns - c0)) - 1u);
        __m512 s = _mm512_maskz_loadu_ps(keep, scale + n0 + c0);
        for (int i = 0; i < mt; i++) {
            __m512 a = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][b]), s), _mm512_set1_ps(t[m0 + i]));
            _mm512_mask_storeu_ps(out + (m0 + i) * ldo + n0 + c0, keep, a);
        }
    }
}

AVX512VNNI static void screen_vnni(const int16_t *r, int64_t K, const int8_t *stripe, const float *scale,
                                   const float *t, float *out, int64_t ldo, int64_t M, int64_t n0, int64_t columns) {
    for (int64_t m = 0; m < M; m += TM) {
        switch (M - m < TM ? M - m : TM) {
        case 1: screen_tile(r, K, stripe, scale, t, out, ldo, m, 1, n0, columns); break;
        case 2: screen_tile(r, K, stripe, scale, t, out, ldo, m, 2, n0, columns); break;
        case 3: screen_tile(r, K, stripe, scale, t, out, ldo, m, 3, n0, columns); break;
        case 4: screen_tile(r, K, stripe, scale, t, out, ldo, m, 4, n0, columns); break;
        case 5: screen_tile(r, K, stripe, scale, t, out, ldo, m, 5, n0, columns); break;
        default: screen_tile(r, K, stripe, scale, t, out, ldo, m, 6, n0, columns); break;
        }
    }
}
#endif

static int vnni(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

/* a [M, N] (row stride ldo) for rows r [M, K] int16 with steps t [M]: the same values on
 * every path (T is exact). isa 0 asks for the plain loop. */
static void screen(int isa, const int16_t *r, int64_t K, const int8_t *q, const float *scale, const float *t,
                   float *out, int64_t ldo, int64_t M, int64_t N) {
    int64_t stripes = (N + STRIPE - 1) / STRIPE;
    int fast = isa != 0 && vnni();
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < stripes; s++) {
        const int8_t *stripe = q + s * (K / 2) * STRIPE * 2;
        int64_t n0 = s * STRIPE, columns = N - n0 < STRIPE ? N - n0 : STRIPE;
#if defined(__x86_64__)
        if (fast) {
            screen_vnni(r, K, stripe, scale, t, out, ldo, M, n0, columns);
            continue;
        }
#endif
        (void)fast;
        screen_scalar(r, K, stripe, scale, t, out, ldo, M, n0, columns);
    }
}

/* ---------------------------------------------------------------- the choice */

/* torch.argmax over bf16 logits: the first maximum, a NaN above everything */
static int64_t first_max(const uint16_t *logits, int64_t n) {
    int64_t best = 0;
    float top = bf16_to_f32(logits[0]);
    if (top != top) return 0;
    for (int64_t j = 1; j < n; j++) {
        float v = bf16_to_f32(logits[j]);
        if (v != v) return j;
        if (v > top) top = v, best = j;
    }
    return best;
}

#define W 16
#define SIGN 0x7fffffff

/* B_j, 16 outputs at a time and one at a time (the same formula: lmchoice.c's top) */
static inline v16f bounds16(v16f a, v16f slack, v16f qslack, float X, float D) {
    return slack * X + qslack * D + (v16f)((v16i)a & SIGN) * 0x1p-20f + ABSOLUTE_SLACK;
}

static inline float bound1(float a, float slack, float qslack, float X, float D) {
    return slack * X + qslack * D + fabsf(a) * 0x1p-20f + ABSOLUTE_SLACK;
}

static inline v16f load16(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* max_j a_j - B_j (NaN-free: a row with a non-finite value never gets here) */
CLONES static float best_lower(const float *a, const float *slack, const float *qslack, int64_t N, float X, float D) {
    v16f top = (v16f){0} - INFINITY;
    int64_t j = 0;
    for (; j + W <= N; j += W) {
        v16f v = load16(a + j), low = v - bounds16(v, load16(slack + j), load16(qslack + j), X, D);
        v16i more = low > top;
        top = (v16f)(((v16i)low & more) | ((v16i)top & ~more));
    }
    float best = -INFINITY, lanes[W];
    memcpy(lanes, &top, sizeof lanes);
    for (int i = 0; i < W; i++) best = lanes[i] > best ? lanes[i] : best;
    for (; j < N; j++) {
        float low = a[j] - bound1(a[j], slack[j], qslack[j], X, D);
        best = low > best ? low : best;
    }
    return best;
}

/* Writes the outputs whose upper end a_j + B_j reaches `threshold` into kept (ascending);
 * returns how many. */
CLONES static int64_t survivors(const float *a, const float *slack, const float *qslack, int64_t N, float X, float D,
                                float threshold, int64_t *kept, int64_t room) {
    int64_t count = 0, j = 0;
    for (; j + W <= N; j += W) {
        v16f v = load16(a + j);
        v16i hit = v + bounds16(v, load16(slack + j), load16(qslack + j), X, D) >= threshold;
        int32_t lanes[W];
        memcpy(lanes, &hit, sizeof lanes);
        int any = 0;
        for (int i = 0; i < W; i++) any |= lanes[i];
        if (!any) continue;
        for (int i = 0; i < W; i++)
            if (lanes[i] && count < room) kept[count++] = j + i;
            else if (lanes[i]) count++;
    }
    for (; j < N; j++)
        if (a[j] + bound1(a[j], slack[j], qslack[j], X, D) >= threshold) {
            if (count < room) kept[count] = j;
            count++;
        }
    return count;
}

#define ROOM 4096 /* survivors examined one by one; past that the row is computed in full */

/* The argmax of one row's exact logits from its screen a (N floats), or -1 when the
 * screen leaves too many candidates to be worth it (the caller computes the row in
 * full). x: the row (K bf16); X, D: its spread and int16 error (quantize_row). */
static int64_t pick(int isa, const uint16_t *x, const float *a, const float *slack, const float *qslack,
                    const uint16_t *lm_head, int64_t N, int64_t K, float X, float D, int64_t *kept) {
    float lower = best_lower(a, slack, qslack, N, X, D);
    float threshold = lower - fabsf(lower) * ROUNDING_SLACK - ABSOLUTE_SLACK;
    int64_t *candidates = malloc(ROOM * sizeof *candidates);
    if (!candidates) return -1;
    int64_t count = survivors(a, slack, qslack, N, X, D, threshold, candidates, ROOM);
    *kept = count;
    int64_t best = -1, stripe = -1;
    float top = 0.0f;
    uint16_t exact[STRIPE];
    for (int64_t i = 0; i < count && count <= ROOM; i++) {
        int64_t j = candidates[i];
        if (j / STRIPE != stripe) {
            stripe = j / STRIPE;
            int64_t columns = N - stripe * STRIPE < STRIPE ? N - stripe * STRIPE : STRIPE;
            rowgemm_stripe_row(isa, x, lm_head + stripe * (K / 2) * STRIPE * 2, exact, columns, K);
        }
        float v = bf16_to_f32(exact[j % STRIPE]);
        if (v != v) { /* a NaN logit: torch's argmax takes the first NaN anywhere */
            best = -1;
            break;
        }
        if (best < 0 || v > top) best = j, top = v;
    }
    free(candidates);
    return count <= ROOM ? best : -1;
}

/* The greedy choices of M rows x [M, K] (bf16, row stride ldx; K even) under lm_head
 * (packed bf16 [N, K]) and its screen: choices[m] is the argmax of bf16(x[m] . lm_head)
 * (the first maximum; a NaN above all), exactly what the full product and torch.argmax
 * give. scores: [M, N] floats of scratch; kept (NULL: not wanted): per row, how many
 * tokens the screen kept (N for a row computed in full). Returns 0, or -1 when out of
 * memory. */
int lmchoice_choose(int isa, const uint16_t *x, int64_t ldx, int64_t M, const int8_t *q, const float *scale,
                    const float *slack, const float *qslack, const uint16_t *lm_head, int64_t N, int64_t K,
                    float *scores, int64_t *choices, int64_t *kept) {
    int16_t *r = calloc((size_t)(M * K), sizeof *r);
    float *rows = malloc((size_t)M * 3 * sizeof *rows); /* t, X, D per row */
    if (!r || !rows) {
        free(r);
        free(rows);
        return -1;
    }
    float *t = rows, *X = rows + M, *D = rows + 2 * M;
    for (int64_t m = 0; m < M; m++) {
        double d = quantize_row(x + m * ldx, K, r + m * K, t + m, X + m);
        D[m] = (float)(d * (1.0 + 0x1p-10));
        if (d < 0) t[m] = 1.0f, D[m] = -1.0f; /* a non-finite row: computed in full below */
    }
    screen(isa, r, K, q, scale, t, scores, N, M, N);
#pragma omp parallel for schedule(dynamic) if (M > 1)
    for (int64_t m = 0; m < M; m++) {
        int64_t count = N, choice = -1;
        if (D[m] >= 0) choice = pick(isa, x + m * ldx, scores + m * N, slack, qslack, lm_head, N, K, X[m], D[m], &count);
        if (choice < 0) { /* the full row, into its own scores (2N bytes of its 4N) */
            uint16_t *logits = (uint16_t *)(scores + m * N);
            for (int64_t s = 0; s * STRIPE < N; s++) {
                int64_t columns = N - s * STRIPE < STRIPE ? N - s * STRIPE : STRIPE;
                rowgemm_stripe_row(isa, x + m * ldx, lm_head + s * (K / 2) * STRIPE * 2, logits + s * STRIPE,
                                   columns, K);
            }
            choice = first_max(logits, N);
            count = N;
        }
        choices[m] = choice;
        if (kept) kept[m] = count;
    }
    free(r);
    free(rows);
    return 0;
}
