/* bf16 <-> fp32 for codespec's C kernels. bf16 travels as uint16_t: the top half of an
 * fp32. Widening is exact; narrowing rounds to nearest even, as torch and VCVTNEPS2BF16 do. */
#ifndef CODESPEC_BF16_H
#define CODESPEC_BF16_H
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* rowgemm.c's packed weights: stripes of STRIPE output columns (BLOCKS x 16 fp32 lanes),
 * each two halves of HALF columns holding their pairs of k in order. stripe_at: where
 * (in bf16 values) column c's pair p sits in a stripe of `pairs` pairs. */
#define STRIPE 64
#define HALF 32
static inline int64_t stripe_at(int64_t pairs, int64_t p, int64_t c) {
    return ((c / HALF * pairs + p) * HALF + c % HALF) * 2;
}

/* rowgemm.c: out[m, n] = bf16(dot(x[m], w[n]) + bias[n]) for weights packed in stripes */
void rowgemm_bf16(int isa, const uint16_t *x, int64_t ldx, const uint16_t *packed, const uint16_t *bias, uint16_t *out,
                  int64_t ldo, int64_t M, int64_t N, int64_t K);
/* rowgemm.c: one row against one stripe (`stripe` points at it), on the calling thread */
void rowgemm_stripe_row(int isa, const uint16_t *x, const uint16_t *stripe, uint16_t *out, int64_t columns, int64_t K);
/* amx.c: whether this process may use the tile unit (asked once), rowgemm's stripe on it, and
 * rowgemm_bf16's isa 3 (one long K in spans; every stripe) */
int amx_ready(void);
void stripe_amx(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias, uint16_t *out,
                int64_t ldo, int64_t M, int64_t pairs, int64_t n0, int64_t columns);
int rowgemm_amx_spans(const uint16_t *x, int64_t ldx, const uint16_t *packed, const uint16_t *bias, uint16_t *out,
                      int64_t ldo, int64_t M, int64_t N, int64_t K);
void rowgemm_amx(const uint16_t *x, int64_t ldx, const uint16_t *packed, const uint16_t *bias, uint16_t *out,
                 int64_t ldo, int64_t M, int64_t N, int64_t K);
/* amx_attention.c: one or two rows' attention scores and weighted values on the tile
 * unit (rowdecoder.c's attention on isa 3, for the shapes amx_attention_fit accepts) */
int amx_attention_fit(int64_t group, int64_t dim);
void amx_scores(const uint16_t *const *q, int64_t rows, const uint16_t *keys, int64_t context, const int64_t *path,
                int64_t n, int64_t padded, int64_t group, int64_t dim, float scale, float *scores);
void amx_weigh(const float *p, const uint16_t *values, int64_t context, const int64_t *path, int64_t n,
               int64_t padded, int64_t heads, int64_t dim, float *acc);
/* attend_avx2.c: rowdecoder.c's attention of one row's heads of one KV head, for rowgemm's AVX2 path */
void attend_avx2(const uint16_t *q, uint16_t *out, const uint16_t *keys, const uint16_t *values, int64_t context,
                 const int64_t *path, int64_t path_len, int64_t group, int64_t dim, float scale, float *scratch);
/* int8.c: int8 weights, rows cut into int16 blocks, their products */
double int8_row(const uint16_t *x, int64_t K, int16_t *r, float *t, float *spread);
void int8_estimates(int isa, const int16_t *r, const float *t, int64_t K, const int8_t *q, const float *scale,
                    float *a, int64_t ldo, int64_t M, int64_t N);
int int8_linear(int isa, const uint16_t *x, int64_t ldx, const int8_t *q, const float *scale, const uint16_t *bias,
                uint16_t *out, int64_t ldo, int64_t M, int64_t N, int64_t K);
/* lmchoice.c: greedy choices through lm_head's int8 screen */
int lmchoice_choose(int isa, const uint16_t *x, int64_t ldx, int64_t M, const int8_t *q, const float *scale,
                    const float *slack, const float *qslack, const uint16_t *lm_head, int64_t N, int64_t K,
                    float *scores, int64_t *choices, int64_t *kept);
#endif
