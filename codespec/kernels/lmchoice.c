/* Greedy choices without reading all of lm_head: an int8 screen, then the exact logits
 * of the few tokens it cannot rule out.
 *
 * A greedy row needs only the argmax of lm_head's bf16 logits (the first maximum, as
 * torch.argmax takes it). The default model's lm_head is 136M bf16 weights: 272 MB,
 * 27% of the bytes a decode step reads, and a CPU decode step is bound by the bytes
 * it reads. The screen holds the same matrix as int8 (int8.c: 136 MB) and gives each
 * token j an estimate a_j and a bound B_j such that the exact fp32 sum v_j that rowgemm
 * computes lies in [a_j - B_j, a_j + B_j], whatever the rounding. A token whose upper
 * end is below the best lower end, less two bf16 steps for the final rounding, cannot
 * be the argmax. The rest (measured on the default model: median 2, at most 24 of
 * 151,936) get their exact logits from the same rowgemm stripes, computed as the full
 * product computes them (a lane's sum never depends on the other lanes: rowgemm.c),
 * and the first maximum among them is the choice. So the choice is the full product's
 * argmax by construction, on any CPU: no tolerance decides a token.
 *
 * The bound, for output j, K inputs, with int8.c's notation (w_k = s q_k + e_k, x_k =
 * t_b r_k + d_k), X = sum |x_k|, D = max |d_k|, E = max |e_k|, Q = sum |q_k|, M = max |w_k|:
 *   S = sum x_k w_k (real); v = fl(S) as rowgemm sums it: |v - S| <= g M X, where
 *       g = K u / (1 - K u), u = 2^-24 (recursive summation of exact products: a product
 *       of two bf16 is exact in fp32);
 *   S - s P = sum x_k e_k + s sum d_k q_k with P = sum_b t_b T_b, so |S - s P| <= E X + s Q D;
 *   the estimate's float steps (nb blocks, each T_b converted and scaled, then added):
 *       |acc - P| <= h sum |t_b T_b| <= h (127 X + Q D), h = (nb + 2) u / (1 - (nb + 2) u),
 *       and a = fl(acc s) adds u |a|.
 * So |v - a| <= (E + g M + 127 h s) X + s Q (1 + h) D + u |a|. int8_pack stores the X and
 * D factors as `slack` and `qslack`, widened by 2^-10 (which also covers the float
 * arithmetic of the bound itself); the bound takes 2^-20 |a| for u |a| and 1e-20 for the
 * subnormals VDPBF16PS flushes. The final rounding to bf16 is monotone and moves a value
 * by at most 2^-8 of it, so the argmax's v is at least best_lower - 2^-7 |best_lower|;
 * the screen keeps every j whose upper end reaches best_lower - 2^-6 |best_lower|.
 */
#include <math.h>
#include <stdlib.h>

#include "bf16.h"
#include "lanes.h"

#define QB 128                        /* int8.c's row block */
#define ROUNDING_SLACK (1.0f / 64.0f) /* two bf16 steps, relative */
#define ABSOLUTE_SLACK 1e-20f         /* subnormals flushed by VDPBF16PS, a few per sum at most */

/* ---------------------------------------------------------------- the choice */

#define W 16

/* torch.argmax over bf16 logits: the first maximum, a NaN above everything. One pass of
 * 2 x 16 lanes, each lane keeping its maximum and where it first saw it (a strict `>`),
 * then the lowest index holding the row's maximum (float equality: +0 and -0 tie, as
 * the one-at-a-time `>` keeps the first of them); a row with a NaN is scanned again for
 * its first. A verify pass of 32 rows took ~4 ms over the default vocabulary one value
 * at a time, ~5% of the pass on the AMX VM. One lane's step: */
#define FIRST_MAX_STEP(top, at, v, index)                                                                            \
    do {                                                                                                             \
        v16i more = v > top;                                                                                         \
        top = pick(more, v, top);                                                                                    \
        at = (more & (index)) | (~more & at);                                                                        \
    } while (0)

CLONES int64_t lmchoice_first_max(const uint16_t *logits, int64_t n) {
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    v16f top0 = splat(-INFINITY), top1 = top0;
    v16i at0 = lane - lane, at1 = at0;
    v16h nan = {0}; /* bit 15 set where a NaN passed: bf16 b is a NaN iff (b & 0x7fff) + 0x7f >= 0x8000 */
    int64_t j = 0;
    for (; j + 2 * W <= n; j += 2 * W) { /* two chains: a compare and a blend wait on the last */
        v16h bits[2];
        memcpy(bits, logits + j, sizeof bits);
        nan |= ((bits[0] & 0x7fff) + 0x7f) | ((bits[1] & 0x7fff) + 0x7f);
        v16f a = (v16f)(__builtin_convertvector(bits[0], v16u) << 16);
        v16f b = (v16f)(__builtin_convertvector(bits[1], v16u) << 16);
        FIRST_MAX_STEP(top0, at0, a, lane + (int32_t)j);
        FIRST_MAX_STEP(top1, at1, b, lane + (int32_t)(j + W));
    }
    v16f top[2] = {top0, top1};
    v16i at[2] = {at0, at1};
    float best = -INFINITY;
    int64_t first = 0;
    int any = 0;
    uint16_t flags[W];
    memcpy(flags, &nan, sizeof flags);
    for (int i = 0; i < W; i++) any |= flags[i] >> 15;
    for (int h = 0; h < 2; h++) {
        float values[W];
        int32_t where[W];
        memcpy(values, &top[h], sizeof values), memcpy(where, &at[h], sizeof where);
        for (int i = 0; i < W; i++)
            if (values[i] > best || (values[i] == best && where[i] < first)) best = values[i], first = where[i];
    }
    for (int64_t i = j; i < n; i++) { /* the tail, after every lane's index */
        float v = bf16_to_f32(logits[i]);
        any |= v != v;
        if (v > best) best = v, first = i;
    }
    if (any)
        for (int64_t i = 0; i < n; i++)
            if (bf16_to_f32(logits[i]) != bf16_to_f32(logits[i])) return i;
    return first;
}

/* B_j, 16 outputs at a time and one at a time (the same formula: lmchoice.c's top) */
static inline v16f bounds16(v16f a, v16f slack, v16f qslack, float X, float D) {
    return slack * X + qslack * D + absolute(a) * 0x1p-20f + ABSOLUTE_SLACK;
}

static inline float bound1(float a, float slack, float qslack, float X, float D) {
    return slack * X + qslack * D + fabsf(a) * 0x1p-20f + ABSOLUTE_SLACK;
}

/* max_j a_j - B_j (NaN-free: a row with a non-finite value never gets here) */
CLONES static float best_lower(const float *a, const float *slack, const float *qslack, int64_t N, float X, float D) {
    v16f top = splat(-INFINITY);
    int64_t j = 0;
    for (; j + W <= N; j += W) {
        v16f v = load(a + j), low = v - bounds16(v, load(slack + j), load(qslack + j), X, D);
        top = pick(low > top, low, top);
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
        v16f v = load(a + j);
        v16i hit = v + bounds16(v, load(slack + j), load(qslack + j), X, D) >= threshold;
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

/* On the tile unit (isa 3) a pass of this many rows computes lm_head in full rather
 * than screening it: the screen's int8 products run on AVX-512 VNNI, and the full
 * product costs little more than one row's. Measured on the 2-core Emerald Rapids VM,
 * whole passes of the default model, medians of 9: 4 rows 34.4 ms either way, 8 rows
 * 36.3 against 38.7, 32 rows 60.3 against 70.7; one row 33.0 against 30.5. Either way
 * the choice is the same: the screen's exact logits are the full product's bits. */
#define AMX_FULL_ROWS 4

/* The fewest rows of a pass that lmchoice_choose computes in full on path `isa` (-1: never) */
int lmchoice_full_rows(int isa) { return isa == 3 ? AMX_FULL_ROWS : -1; }
#define ROOM 4096 /* survivors examined one by one; past that the row is computed in full */

/* The argmax of one row's exact logits from its screen a (N floats), or -1 when the
 * screen leaves too many candidates to be worth it (the caller computes the row in
 * full). x: the row (K bf16); X, D: its spread and int16 error (int8_row). */
static int64_t decide(int isa, const uint16_t *x, const float *a, const float *slack, const float *qslack,
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
    if (isa == 3 && M >= AMX_FULL_ROWS) { /* every row in full, into the scratch's first half */
        uint16_t *logits = (uint16_t *)scores;
        rowgemm_bf16(isa, x, ldx, lm_head, NULL, logits, N, M, N, K);
#pragma omp parallel for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            choices[m] = lmchoice_first_max(logits + m * N, N);
            if (kept) kept[m] = N;
        }
        return 0;
    }
    int64_t blocks = (K + QB - 1) / QB;
    int16_t *r = malloc((size_t)(M * K) * sizeof *r);
    float *t = malloc((size_t)(M * blocks) * sizeof *t), *rows = malloc((size_t)M * 2 * sizeof *rows);
    if (!r || !t || !rows) {
        free(r);
        free(t);
        free(rows);
        return -1;
    }
    float *X = rows, *D = rows + M; /* per row: spread and int16 error */
    for (int64_t m = 0; m < M; m++) {
        double d = int8_row(x + m * ldx, K, r + m * K, t + m * blocks, X + m);
        D[m] = d < 0 ? -1.0f : (float)(d * (1.0 + 0x1p-10)); /* -1: a non-finite row, computed in full below */
    }
    int8_estimates(isa, r, t, K, q, scale, scores, N, M, N);
#pragma omp parallel for schedule(dynamic) if (M > 1)
    for (int64_t m = 0; m < M; m++) {
        int64_t count = N, choice = -1;
        if (D[m] >= 0) choice = decide(isa, x + m * ldx, scores + m * N, slack, qslack, lm_head, N, K, X[m], D[m], &count);
        if (choice < 0) { /* the full row, into its own scores (2N bytes of its 4N) */
            uint16_t *logits = (uint16_t *)(scores + m * N);
            rowgemm_bf16(isa, x + m * ldx, K, lm_head, NULL, logits, N, 1, N, K);
            choice = lmchoice_first_max(logits, N);
            count = N;
        }
        choices[m] = choice;
        if (kept) kept[m] = count;
    }
    free(r);
    free(t);
    free(rows);
    return 0;
}
