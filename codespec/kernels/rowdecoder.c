/* A decoder stack's decode steps and verify passes in one call, every row computed alone.
 *
 * What a Qwen2/Llama layer does to a row, in the order and with the bf16 roundings of
 * transformers' eager forward (RMSNorm, q/k/v with rotary, attention over the row's
 * keys in the KV slots, o, residual, RMSNorm, SiLU-gated MLP, residual), then the final
 * norm and lm_head. Products go through rowgemm.c; everything else is here.
 *
 * Why: lossless speculation needs a verify pass's row to get the bits of the decode
 * step it stands for. Each piece here is a function of its own row alone:
 *   - norms, rotary, SiLU, residuals: per element or per row, in a fixed order;
 *   - attention: a row scores its own key sequence (the slot's first `context` keys,
 *     then its `path` positions: an off-path tree row's ancestors and itself), in the
 *     order decoding would see them: scores of 16 keys at a time (lanes = dims, then a
 *     fixed transposing reduction), a max, exponentials, a sum in 16 lanes then a fixed
 *     tree, and the weighted values summed key by key. A key's index in the row's own
 *     sequence decides every summation, never the call around it;
 *   - threads split rows, heads or stripes; no sum is ever split between threads.
 * So a row's output is the same whatever the pass holds: by construction, on any CPU.
 * The arithmetic uses GCC's vector extensions (no FMA contraction: -ffp-contract=off),
 * so both clones (AVX-512, baseline) compute the same bits.
 *
 * The forward also replaces transformers' per-op dispatch: a 24-layer decode step is
 * one call from Python, not ~1,500 torch ops.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "bf16.h"
#include "lanes.h"

#define W 16 /* lanes */
#define INLINE static inline __attribute__((always_inline))

typedef struct {
    const uint16_t *norm_in;   /* [hidden] */
    const uint16_t *qkv;       /* rowgemm stripes of [q; k; v] x hidden */
    const uint16_t *qkv_bias;  /* [q + k + v] or NULL */
    const uint16_t *o;         /* stripes of hidden x (heads * dim) */
    const uint16_t *o_bias;    /* [hidden] or NULL */
    const uint16_t *norm_post; /* [hidden] */
    const uint16_t *gate_up;   /* stripes of [gate; up] x hidden */
    const uint16_t *down;      /* stripes of hidden x inter */
    /* --quantize int8 (int8.c): the same four products as int8 stripes and their steps;
     * NULL: bf16 */
    const int8_t *qkv_q, *o_q, *gate_up_q, *down_q;
    const float *qkv_s, *o_s, *gate_up_s, *down_s;
} Layer;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    float eps, scale;
    const Layer *layer;
    const uint16_t *norm_final, *lm_head, *lm_bias; /* lm_head: stripes of vocab x hidden */
    const uint16_t *cos, *sin;                      /* [positions][head_dim] rotary tables */
    int64_t positions;
    const int8_t *lm_q; /* lm_head in int8 (int8.c), or NULL */
    const float *lm_s;
} Model;

typedef struct {
    int64_t rows;
    const int64_t *slot, *write, *position; /* [rows]: KV slot, where its K/V go, rotary position */
    const int64_t *context;                 /* [rows]: it attends to the slot's first `context` keys ... */
    const int64_t *path_start, *path_len;   /* ... then path[path_start .. + path_len) */
    const int64_t *path;
    uint16_t *const *keys, *const *values; /* per layer: [slots][kv_heads][capacity][head_dim] */
    int64_t capacity;
    int64_t logits_from; /* logits of rows [logits_from, rows) only (prefill needs the last row's) */
    int (*stop)(void);   /* asked before each layer (NULL: never): nonzero ends the pass, -2 (a request came) */
} Pass;

/* ---------------------------------------------------------------- lanes */

/* splat, load, widen, pick: lanes.h */

INLINE v16h narrow(v16f f) { /* f32_to_bf16 on every lane */
    v16u u = (v16u)f;
    v16u rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    v16u nan = (v16u)((u & 0x7fffffffu) > 0x7f800000u);
    return __builtin_convertvector((rounded & ~nan) | (((u >> 16) | 0x40u) & nan), v16h);
}

INLINE void store(uint16_t *p, v16f f) {
    v16h h = narrow(f);
    memcpy(p, &h, sizeof h);
}

INLINE v16f round_bf16(v16f f) { /* what a bf16 tensor holds */
    v16h h = narrow(f);
    return (v16f)(__builtin_convertvector(h, v16u) << 16);
}

INLINE float sum16(v16f v) { /* a fixed tree: lanes (i, i+8), (i, i+4), (i, i+2), (i, i+1) */
    float t[W];
    memcpy(t, &v, sizeof t);
    for (int w = W / 2; w; w >>= 1)
        for (int i = 0; i < w; i++) t[i] += t[i + w];
    return t[0];
}

/* e^x, Cephes' expf polynomial: same bits on every clone (only +, -, *, conversions) */
INLINE v16f exp16(v16f x) {
    x = pick(x > EXP_MAX, splat(EXP_MAX), x);
    x = pick(x < EXP_MIN, splat(EXP_MIN), x);
    v16f fx = x * EXP_LOG2E + 0.5f;
    v16f whole = __builtin_convertvector(__builtin_convertvector(fx, v16i), v16f); /* toward zero */
    whole = whole - pick(whole > fx, splat(1.0f), splat(0.0f));                   /* floor */
    x = x - whole * EXP_LN2_HI;
    x = x - whole * EXP_LN2_LO;
    v16f z = x * x;
    v16f y = splat(EXP_POLY[0]);
    for (int i = 1; i < EXP_TERMS; i++) y = y * x + EXP_POLY[i];
    y = y * z + x + 1.0f;
    v16i n = __builtin_convertvector(whole, v16i);
    return y * (v16f)((n + 127) << 23);
}

/* 16 vectors of partial sums (one per key) -> one vector of 16 sums, each key's lanes
 * added in the same tree wherever it sits: (i, i+8), (i, i+4), (i, i+2), (i, i+1). */
INLINE v16f reduce16(const v16f *p) {
    v16f a[8], b[4], c[2];
    for (int k = 0; k < 8; k++)
        a[k] = __builtin_shufflevector(p[2 * k], p[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(p[2 * k], p[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int k = 0; k < 4; k++)
        b[k] = __builtin_shufflevector(a[2 * k], a[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(a[2 * k], a[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int k = 0; k < 2; k++)
        c[k] = __builtin_shufflevector(b[2 * k], b[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(b[2 * k], b[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

/* ---------------------------------------------------------------- per row */

/* transformers' RMSNorm: bf16(w * bf16(x * rsqrt(mean(x^2) + eps))) */
CLONES static void rms_norm(const uint16_t *x, const uint16_t *weight, uint16_t *out, int64_t n, float eps) {
    v16f squares = splat(0.0f);
    for (int64_t i = 0; i < n; i += W) {
        v16f v = widen(x + i);
        squares = squares + v * v;
    }
    float inv = 1.0f / sqrtf(sum16(squares) / (float)n + eps);
    for (int64_t i = 0; i < n; i += W) store(out + i, widen(weight + i) * round_bf16(widen(x + i) * inv));
}

/* q * cos + rotate_half(q) * sin, each product and the sum rounded to bf16 (16 lanes at
 * a time where half a head is whole vectors: the same operations per element) */
CLONES static void rotate(uint16_t *v, const uint16_t *cos, const uint16_t *sin, int64_t dim) {
    uint16_t out[512];
    int64_t half = dim / 2;
    for (int64_t i = 0; half % W == 0 && i < dim; i += W) {
        v16f turned = i < half ? -widen(v + i + half) : widen(v + i - half);
        store(out + i, round_bf16(widen(v + i) * widen(cos + i)) + round_bf16(turned * widen(sin + i)));
    }
    for (int64_t i = 0; half % W != 0 && i < dim; i++) {
        float turned = i < half ? -bf16_to_f32(v[i + half]) : bf16_to_f32(v[i - half]);
        float a = bf16_to_f32(f32_to_bf16(bf16_to_f32(v[i]) * bf16_to_f32(cos[i])));
        float b = bf16_to_f32(f32_to_bf16(turned * bf16_to_f32(sin[i])));
        out[i] = f32_to_bf16(a + b);
    }
    memcpy(v, out, (size_t)dim * sizeof *v);
}

/* bf16(bf16(silu(g)) * u), silu(g) = g / (1 + e^-g) */
CLONES static void silu_mul(const uint16_t *gate, const uint16_t *up, uint16_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i += W) {
        v16f g = widen(gate + i);
        store(out + i, round_bf16(g / (1.0f + exp16(-g))) * widen(up + i));
    }
}

CLONES static void add_rows(uint16_t *x, const uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i += W) store(x + i, widen(x + i) + widen(y + i));
}

/* Attention of one row's query heads of one KV head, a batch of `hb` heads at a time so
 * that their queries (scores) or accumulators (weighted values) stay in registers: `hb`
 * and `chunks` are constants at every call (the switches below). Batching changes no
 * sum: each head's arithmetic is the same whatever batch it is in. */

#define KEY(j) ((j) < context ? (j) : path[(j) - context]) /* slot position of the row's j-th key */

/* scores[h][j] = scale * dot(q_h, k_j) for j < n; 16 keys at a time, lanes over dims,
 * then `reduce16`: key j's sum is the same tree wherever j sits */
INLINE void score_heads(const uint16_t *q, const uint16_t *keys, int64_t context, const int64_t *path, int64_t n,
                        int64_t padded, const int hb, const int chunks, float scale, float *scores) {
    v16f qf[4][8];
    for (int h = 0; h < hb; h++)
        for (int c = 0; c < chunks; c++) qf[h][c] = widen(q + (h * chunks + c) * W);
    v16f parts[4][W];
    for (int64_t j0 = 0; j0 < padded; j0 += W) {
        for (int l = 0; l < W; l++) {
            if (j0 + l >= n) {
                for (int h = 0; h < hb; h++) parts[h][l] = splat(0.0f);
                continue;
            }
            const uint16_t *k = keys + KEY(j0 + l) * chunks * W;
            v16f kf[8];
            for (int c = 0; c < chunks; c++) kf[c] = widen(k + c * W);
            for (int h = 0; h < hb; h++) {
                v16f sum = qf[h][0] * kf[0];
                for (int c = 1; c < chunks; c++) sum = sum + qf[h][c] * kf[c];
                parts[h][l] = sum;
            }
        }
        for (int h = 0; h < hb; h++) {
            v16f sum = reduce16(parts[h]) * scale;
            memcpy(scores + h * padded + j0, &sum, sizeof sum);
        }
    }
}

/* acc[h] = sum over j < n, in order, of p[h][j] * v_j */
INLINE void weigh_heads(const float *p, const uint16_t *values, int64_t context, const int64_t *path, int64_t n,
                        int64_t padded, const int hb, const int chunks, float *acc) {
    v16f sum[4][8];
    for (int h = 0; h < hb; h++)
        for (int c = 0; c < chunks; c++) sum[h][c] = splat(0.0f);
    for (int64_t j = 0; j < n; j++) {
        const uint16_t *v = values + KEY(j) * chunks * W;
        v16f vf[8];
        for (int c = 0; c < chunks; c++) vf[c] = widen(v + c * W);
        for (int h = 0; h < hb; h++) {
            v16f weight = splat(p[h * padded + j]);
            for (int c = 0; c < chunks; c++) sum[h][c] = sum[h][c] + weight * vf[c];
        }
    }
    for (int h = 0; h < hb; h++) memcpy(acc + h * chunks * W, sum[h], (size_t)chunks * sizeof(v16f));
}

#define HEADS_AT_ONCE(chunks) ((chunks) <= 4 ? 4 : 2) /* <= 16 registers of queries or sums */

#define DISPATCH(call, hb, chunks)                                                                                  \
    switch ((chunks) * 8 + (hb)) {                                                                                  \
    case 33: call(1, 4); break;                                                                                    \
    case 34: call(2, 4); break;                                                                                    \
    case 35: call(3, 4); break;                                                                                    \
    case 36: call(4, 4); break;                                                                                    \
    case 65: call(1, 8); break;                                                                                    \
    default: call(2, 8); break;                                                                                    \
    }

/* The query heads of one KV head of one row, or, on the tile unit, of two rows of a
 * slot that both see only the slot's first keys (`pair_rows`): a pair takes one pass
 * over the later row's keys, both rows' heads in each tile. */
typedef struct {
    int count;            /* rows: 1, or 2 (tiles only) */
    const uint16_t *q[2]; /* each row's rotated queries of this group: [group][dim] bf16 */
    uint16_t *out[2];     /* likewise */
    int64_t n[2];         /* each row's keys */
} Heads;

/* The rows' heads against their keys: the slot's first `context` keys, then `path`'s
 * (one row alone; a pair's context is its later row's keys and it has no path). dim is
 * 64 or 128 (checked by the caller). scratch: count * group * (keys rounded up to 16)
 * floats plus count * group * dim. A paired row's bits are its own: its scores past its
 * keys are dropped (-inf, so e^x adds exact zeros to its sum) and weigh zero. */
CLONES static void attend(const Heads *r, const uint16_t *keys, const uint16_t *values, int64_t context,
                          const int64_t *path, int64_t path_len, int64_t group, int64_t dim, float scale,
                          float *scratch, int tiles) {
    int64_t n = context + path_len, padded = (n + W - 1) / W * W, heads = r->count * group;
    int chunks = (int)(dim / W), most = HEADS_AT_ONCE(chunks);
    float *scores = scratch, *acc = scratch + heads * padded;
    const uint16_t *q = r->q[0];
    if (tiles) /* isa 3: the scores from the tile unit (amx_attention.c), other bits than score_heads' */
        amx_scores(r->q, r->count, keys, context, path, n, padded, group, dim, scale, scores);
    for (int64_t h0 = 0; h0 < group && !tiles; h0 += most) {
        int hb = group - h0 < most ? (int)(group - h0) : most;
#define SCORE(HB, CH) score_heads(q + h0 * dim, keys, context, path, n, padded, HB, CH, scale, scores + h0 * padded)
        DISPATCH(SCORE, hb, chunks)
#undef SCORE
    }
    float sums[16];
    for (int64_t h = 0; h < heads; h++) {
        float *s = scores + h * padded;
        for (int64_t j = r->n[h / group]; j < padded; j++) s[j] = -INFINITY;
        v16f top = splat(-INFINITY);
        for (int64_t j = 0; j < padded; j += W) {
            v16f v;
            memcpy(&v, s + j, sizeof v);
            top = pick(v > top, v, top);
        }
        float best = -INFINITY, t[W];
        memcpy(t, &top, sizeof t);
        for (int i = 0; i < W; i++) best = t[i] > best ? t[i] : best;
        v16f total = splat(0.0f);
        for (int64_t j = 0; j < padded; j += W) {
            v16f v;
            memcpy(&v, s + j, sizeof v);
            v16f e = pick(v == -INFINITY, splat(0.0f), exp16(v - best)); /* keys past the row's: nothing */
            memcpy(s + j, &e, sizeof e);
            total = total + e;
        }
        sums[h] = sum16(total);
    }
    if (tiles) /* and the weighted values (amx_attention.c) */
        amx_weigh(scores, values, context, path, n, padded, heads, dim, acc);
    for (int64_t h0 = 0; h0 < group && !tiles; h0 += most) {
        int hb = group - h0 < most ? (int)(group - h0) : most;
#define WEIGH(HB, CH) weigh_heads(scores + h0 * padded, values, context, path, n, padded, HB, CH, acc + h0 * dim)
        DISPATCH(WEIGH, hb, chunks)
#undef WEIGH
    }
    for (int64_t h = 0; h < heads; h++)
        for (int c = 0; c < chunks; c++) {
            v16f v;
            memcpy(&v, acc + h * dim + c * W, sizeof v);
            store(r->out[h / group] + h % group * dim + c * W, v / sums[h]);
        }
}

/* ---------------------------------------------------------------- the stack */

typedef struct {
    uint16_t *normed, *qkv, *attended, *mlp, *gated;
} Work;

static Work carve(const Model *m, int64_t rows, uint16_t *work) {
    int64_t qkv = (m->heads + 2 * m->kv_heads) * m->head_dim;
    Work w;
    w.normed = work;
    w.qkv = w.normed + rows * m->hidden;
    w.attended = w.qkv + rows * qkv;
    w.mlp = w.attended + rows * m->heads * m->head_dim;
    w.gated = w.mlp + rows * 2 * m->inter;
    return w;
}

/* bf16 elements of the work buffer a pass of `rows` rows needs */
int64_t rowdecoder_work(const Model *m, int64_t rows) {
    int64_t qkv = (m->heads + 2 * m->kv_heads) * m->head_dim;
    return rows * (m->hidden + qkv + m->heads * m->head_dim + 3 * m->inter);
}

/* floats of attention scratch one thread needs for rows seeing at most `keys` keys
 * (attend's, for a pair of rows; attend_avx2 needs 2 * dim + 1 a head besides the
 * scores) */
static int64_t scratch_floats(const Model *m, int64_t keys) {
    int64_t group = m->heads / m->kv_heads;
    return 2 * group * ((keys + W - 1) / W * W + 2 * m->head_dim + 1);
}

/* Whether rows r and r + 1 attend as a pair on the tile unit (`paired`: the tile unit
 * runs this layer's attention and takes both rows' heads at once, amx_attention_fit):
 * one slot, both seeing the slot's first keys alone (a prefill pass's rows, a verify
 * pass's main path). Pairs halve the tile instructions of the attention and share each
 * key's loads. */
static int pair_rows(const Pass *p, int64_t r, int paired) {
    return paired && r + 1 < p->rows && p->slot[r] == p->slot[r + 1] && p->path_len[r] == 0 &&
           p->path_len[r + 1] == 0;
}

/* out = x . w^T + bias through the bf16 stripes, or their int8 form where given;
 * -1 when the int8 product found no memory for its int16 rows */
static int product(int isa, const uint16_t *x, int64_t ldx, const uint16_t *w, const int8_t *q, const float *s,
                   const uint16_t *bias, uint16_t *out, int64_t ldo, int64_t M, int64_t N, int64_t K) {
    if (q) return int8_linear(isa, x, ldx, q, s, bias, out, ldo, M, N, K);
    rowgemm_bf16(isa, x, ldx, w, bias, out, ldo, M, N, K);
    return 0;
}

/* One layer over every row of the pass; -1 when a product failed (no memory) */
static int layer(int isa, const Model *m, int64_t index, const Pass *p, uint16_t *x, Work w, int64_t most_keys) {
    const Layer *L = m->layer + index;
    int64_t rows = p->rows, H = m->hidden, D = m->head_dim, Q = m->heads * D, KV = m->kv_heads * D;
    int64_t NQKV = Q + 2 * KV, I = m->inter, group = m->heads / m->kv_heads;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) rms_norm(x + r * H, L->norm_in, w.normed + r * H, H, m->eps);
    if (product(isa, w.normed, H, L->qkv, L->qkv_q, L->qkv_s, L->qkv_bias, w.qkv, NQKV, rows, NQKV, H)) return -1;
    uint16_t *keys = p->keys[index], *values = p->values[index];
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *row = w.qkv + r * NQKV;
        const uint16_t *cos = m->cos + p->position[r] * D, *sin = m->sin + p->position[r] * D;
        for (int64_t h = 0; h < m->heads + m->kv_heads; h++) rotate(row + h * D, cos, sin, D);
        for (int64_t g = 0; g < m->kv_heads; g++) {
            int64_t at = ((p->slot[r] * m->kv_heads + g) * p->capacity + p->write[r]) * D;
            memcpy(keys + at, row + Q + g * D, (size_t)D * sizeof *keys);
            memcpy(values + at, row + Q + KV + g * D, (size_t)D * sizeof *values);
        }
    }
    const int tiles = isa == 3 && amx_attention_fit(group, D), paired = tiles && amx_attention_fit(2 * group, D);
    int64_t *lead = malloc((size_t)(rows + 1) * sizeof *lead), leads = 0; /* each task's first row, then `rows` */
    if (!lead) return -1;
    for (int64_t r = 0; r < rows; r += pair_rows(p, r, paired) ? 2 : 1) lead[leads++] = r;
    lead[leads] = rows;
#pragma omp parallel
    {
        size_t bytes = ((size_t)scratch_floats(m, most_keys) * sizeof(float) + 63) / 64 * 64; /* whole 64s */
        float *scratch = aligned_alloc(64, bytes);
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < leads * m->kv_heads; task++) {
            int64_t r = lead[task / m->kv_heads], g = task % m->kv_heads;
            int64_t base = (p->slot[r] * m->kv_heads + g) * p->capacity * D;
            Heads h = {.count = (int)(lead[task / m->kv_heads + 1] - r)};
            for (int i = 0; i < h.count; i++) {
                h.q[i] = w.qkv + (r + i) * NQKV + g * group * D;
                h.out[i] = w.attended + (r + i) * Q + g * group * D;
                h.n[i] = p->context[r + i] + p->path_len[r + i];
            }
            int64_t context = h.count == 2 && h.n[1] > h.n[0] ? h.n[1] : p->context[r]; /* a pair: no path */
            /* rowgemm's AVX2 path has its own attention (attend_avx2.c: 8 lanes, no spills) */
            if (isa == 1)
                attend_avx2(h.q[0], h.out[0], keys + base, values + base, p->context[r], p->path + p->path_start[r],
                            p->path_len[r], group, D, m->scale, scratch);
            else
                attend(&h, keys + base, values + base, context, p->path + p->path_start[r], p->path_len[r], group, D,
                       m->scale, scratch, tiles);
        }
        free(scratch);
    }
    free(lead);
    if (product(isa, w.attended, Q, L->o, L->o_q, L->o_s, L->o_bias, w.normed, H, rows, H, Q)) return -1;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        add_rows(x + r * H, w.normed + r * H, H);
        rms_norm(x + r * H, L->norm_post, w.normed + r * H, H, m->eps);
    }
    if (product(isa, w.normed, H, L->gate_up, L->gate_up_q, L->gate_up_s, NULL, w.mlp, 2 * I, rows, 2 * I, H))
        return -1;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) silu_mul(w.mlp + r * 2 * I, w.mlp + r * 2 * I + I, w.gated + r * I, I);
    if (product(isa, w.gated, I, L->down, L->down_q, L->down_s, NULL, w.normed, H, rows, H, I)) return -1;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) add_rows(x + r * H, w.normed + r * H, H);
    return 0;
}

/* The OpenMP threads of later calls. A process that loaded torch shares torch's pool
 * (torch.set_num_threads sizes it); the direct path, without torch, sizes it here. */
void rowdecoder_threads(int threads) { omp_set_num_threads(threads); }

#define STOPPED (-2)

/* The layers and the final norm of rows [logits_from, rows) into w.normed; -1 for a
 * pass it cannot run (a row without keys, a position past the table, no row to give
 * logits for, no memory), STOPPED when `stop` said so (the K/V written so far lie past
 * the slot's length: nothing reads them). */
static int stack(int isa, const Model *m, const Pass *p, uint16_t *x, Work w) {
    int64_t most_keys = 1, first = p->logits_from;
    if (first < 0 || first >= p->rows) return -1;
    for (int64_t r = 0; r < p->rows; r++) {
        int64_t keys = p->context[r] + p->path_len[r];
        if (keys < 1 || p->position[r] < 0 || p->position[r] >= m->positions) return -1;
        most_keys = keys > most_keys ? keys : most_keys;
    }
    for (int64_t i = 0; i < m->layers; i++) {
        if (p->stop && p->stop()) return STOPPED; /* a background prefill gives way between layers */
        if (layer(isa, m, i, p, x, w, most_keys)) return -1;
    }
    for (int64_t r = first; r < p->rows; r++) rms_norm(x + r * m->hidden, m->norm_final, w.normed + r * m->hidden,
                                                       m->hidden, m->eps);
    return 0;
}

/* x: [rows][hidden] the rows' embeddings (overwritten); logits: [rows - logits_from][vocab].
 * Returns 0, -1 for a pass it cannot run, or STOPPED (-2) when `stop` ended it. */
int rowdecoder_forward(int isa, const Model *m, const Pass *p, uint16_t *x, uint16_t *work, uint16_t *logits) {
    Work w = carve(m, p->rows, work);
    int status = stack(isa, m, p, x, w);
    if (status) return status;
    int64_t first = p->logits_from;
    return product(isa, w.normed + first * m->hidden, m->hidden, m->lm_head, m->lm_q, m->lm_s, m->lm_bias, logits,
                   m->vocab, p->rows - first, m->vocab, m->hidden);
}

/* The greedy choice (argmax of the logits rowdecoder_forward would give) of rows
 * [logits_from, rows), through lm_head's int8 screen (lmchoice.c; the model has no
 * lm_head bias). scores: [rows - logits_from][vocab] floats of scratch; kept: how many
 * tokens each row's screen kept (NULL: not wanted). */
int rowdecoder_choices(int isa, const Model *m, const int8_t *q, const float *scale, const float *slack,
                       const float *qslack, const Pass *p, uint16_t *x, uint16_t *work, float *scores,
                       int64_t *choices, int64_t *kept) {
    Work w = carve(m, p->rows, work);
    if (m->lm_bias || m->lm_q) return -1;
    int status = stack(isa, m, p, x, w);
    if (status) return status;
    int64_t first = p->logits_from;
    return lmchoice_choose(isa, w.normed + first * m->hidden, m->hidden, p->rows - first, q, scale, slack, qslack,
                           m->lm_head, m->vocab, m->hidden, scores, choices, kept);
}
