/* rowdecoder.c's attention on Intel's tile unit (isa 3): a row's scores and its weighted
 * values, each a function of that row's query, keys, weights and values alone. Both
 * need group <= 16 and dim a multiple of 64, at most 128 (amx_attention_fit); the
 * softmax between them stays in rowdecoder.c. */
#include "amx.h"

#ifdef HAVE_AMX
int amx_attention_fit(int64_t group, int64_t dim) { return group <= 16 && dim % 64 == 0 && dim <= 128; }

/* out[i] = column i of the 16 x 16 floats at `in` (row-major): in-lane pairs, then
 * quads, then 128-bit lanes twice */
AMX static inline void transpose16(const float *in, __m512 out[TILE_ROWS]) {
    __m512 t[TILE_ROWS];
    for (int i = 0; i < TILE_ROWS; i++) out[i] = _mm512_loadu_ps(in + LANES * i);
    for (int i = 0; i < TILE_ROWS; i += 2) {
        t[i] = _mm512_unpacklo_ps(out[i], out[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(out[i], out[i + 1]);
    }
    for (int i = 0; i < TILE_ROWS; i += 4) {
        out[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        out[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        out[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        out[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(out[i], out[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(out[i], out[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(out[i + 8], out[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(out[i + 8], out[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        out[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        out[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* ---------------------------------------------------------------- scores
 *
 * rowdecoder.c's attention on isa 3 takes its scores from here: scores[h][j] =
 * scale * dot(q_h, k_j) for the keys j < n (the slot's first `context` positions, then
 * the path's), through TDPBF16PS: 16 keys are the A operand (as the slot stores them,
 * or gathered), the query heads of one row, or of two rows that see the same keys
 * (q[0], q[1]: rows * group <= 16), the B operand (its columns), and each score takes
 * the head's dimensions in blocks of 32, in order. A score's bits depend on its query
 * and key alone, never on the column it sits in or the pass around the row. */
AMX void amx_scores(const uint16_t *const *q, int64_t rows, const uint16_t *keys, int64_t context,
                    const int64_t *path, int64_t n, int64_t padded, int64_t group, int64_t dim, float scale,
                    float *scores) {
    const int blocks = (int)(dim / 32);
    uint16_t heads[4][BLOCK_PAIRS * LANES * 2]; /* B: [pair][head][2], columns past the heads zero */
    uint16_t gathered[TILE_ROWS * 128];
    float sums[TILE_ROWS * LANES];
    memset(heads, 0, sizeof heads);
    for (int64_t r = 0; r < rows; r++) /* row r's heads in columns r * group .. */
        for (int64_t h = 0; h < group; h++)
            for (int64_t d = 0; d < dim; d++)
                heads[d / 32][(d % 32 / 2) * LANES * 2 + (r * group + h) * 2 + d % 2] = q[r][h * dim + d];
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2 + blocks; t++) c.rows[t] = TILE_ROWS, c.colsb[t] = 64; /* 0 sums, 1 keys, 2.. heads */
    _tile_loadconfig(&c);
    MEMORY_BARRIER();
    _tile_loadd(2, heads[0], 64);
    if (blocks > 1) _tile_loadd(3, heads[1], 64);
    if (blocks > 2) _tile_loadd(4, heads[2], 64);
    if (blocks > 3) _tile_loadd(5, heads[3], 64);
    const int64_t stride = dim * (int64_t)sizeof(uint16_t);
    for (int64_t j0 = 0; j0 < padded; j0 += TILE_ROWS) {
        const uint16_t *k = keys + j0 * dim;
        if (j0 + TILE_ROWS > context) { /* path keys, or past n: gather (zeros past n) */
            for (int l = 0; l < TILE_ROWS; l++) {
                int64_t j = j0 + l;
                if (j < n) memcpy(gathered + l * dim, keys + (j < context ? j : path[j - context]) * dim, stride);
                else memset(gathered + l * dim, 0, stride);
            }
            k = gathered;
            MEMORY_BARRIER();
        }
        _tile_zero(0);
        _tile_loadd(1, k, stride);
        _tile_dpbf16ps(0, 1, 2);
        if (blocks > 1) {
            _tile_loadd(1, k + 32, stride);
            _tile_dpbf16ps(0, 1, 3);
        }
        if (blocks > 2) {
            _tile_loadd(1, k + 64, stride);
            _tile_dpbf16ps(0, 1, 4);
        }
        if (blocks > 3) {
            _tile_loadd(1, k + 96, stride);
            _tile_dpbf16ps(0, 1, 5);
        }
        _tile_stored(0, sums, LANES * sizeof(float));
        __m512 heads_keys[TILE_ROWS]; /* sums is [key][head]; scores want [head][key] */
        transpose16(sums, heads_keys);
        for (int64_t h = 0; h < rows * group; h++)
            _mm512_storeu_ps(scores + h * padded + j0, _mm512_mul_ps(heads_keys[h], _mm512_set1_ps(scale)));
    }
    _tile_release();
}

/* ---------------------------------------------------------------- attention's weighted values
 *
 * acc[h][d] = sum over the keys j < n of p[h][j] * v_j[d] for `heads` (<= 16) heads,
 * for rowdecoder.c's attention on isa 3 (it divides by the softmax's sums afterwards).
 * A row paired with a later one (amx_scores) weighs the keys past its own with zeros:
 * each adds an exact +-0 to a sum that starts at +0 and leaves it as it was. The tile unit takes
 * bf16 operands, so each weight p is split into p_hi = bf16(p) and p_lo = bf16(p - p_hi)
 * (together ~16 significant bits where fp32 has 24; bf16 alone would keep 8), and the
 * keys go in blocks of 32: per block and per 16 dimensions, p_hi then p_lo against the
 * block's values, as TDPBF16PS sums them. The values are re-laid in pairs of keys (the B
 * operand's layout) per block. Keys past n weigh zero and read nothing. A row's sums
 * depend on its weights and values alone. */
AMX void amx_weigh(const float *p, const uint16_t *values, int64_t context, const int64_t *path, int64_t n,
                   int64_t padded, int64_t heads, int64_t dim, float *acc) {
    uint16_t hi[TILE_ROWS * 32], lo[TILE_ROWS * 32]; /* A: [head][32 keys] */
    uint16_t pairs[4][BLOCK_PAIRS * LANES * 2];      /* B per 16 dims: [key pair][dim][2] */
    const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                           37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(16));
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t++) c.rows[t] = (uint8_t)heads, c.colsb[t] = 64; /* 0-3 sums, 4 p_hi, 5 p_lo */
    c.rows[6] = BLOCK_PAIRS, c.colsb[6] = 64;                               /* 6 values */
    _tile_loadconfig(&c);
    for (int64_t d0 = 0; d0 < dim; d0 += 64) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t j0 = 0; j0 < n; j0 += 32) {
            for (int half = 0; half < 2; half++) { /* keys j0 + 16 half .. + 15: VCVTNEPS2BF16 rounds to nearest even */
                int64_t left = n - j0 - 16 * half;
                __mmask16 keep = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
                for (int64_t h = 0; h < heads; h++) {
                    __m512 w = _mm512_maskz_loadu_ps(keep, p + h * padded + j0 + 16 * half);
                    __m256bh top = _mm512_cvtneps_pbh(w);
                    __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)top), 16));
                    _mm256_storeu_si256((__m256i *)(hi + h * 32 + 16 * half), (__m256i)top);
                    __m256bh rest = _mm512_cvtneps_pbh(_mm512_sub_ps(w, back));
                    _mm256_storeu_si256((__m256i *)(lo + h * 32 + 16 * half), (__m256i)rest);
                }
            }
            for (int kp = 0; kp < BLOCK_PAIRS; kp++) {
                __m512i v[2][2]; /* [key of the pair][dims d0..d0+31, d0+32..d0+63] */
                for (int e = 0; e < 2; e++) {
                    int64_t j = j0 + 2 * kp + e;
                    if (j < n) {
                        const uint16_t *row = values + (j < context ? j : path[j - context]) * dim + d0;
                        v[e][0] = _mm512_loadu_si512(row);
                        v[e][1] = _mm512_loadu_si512(row + 32);
                    } else {
                        v[e][0] = v[e][1] = _mm512_setzero_si512();
                    }
                }
                for (int half = 0; half < 2; half++) {
                    _mm512_storeu_si512(pairs[2 * half] + kp * LANES * 2,
                                        _mm512_permutex2var_epi16(v[0][half], first, v[1][half]));
                    _mm512_storeu_si512(pairs[2 * half + 1] + kp * LANES * 2,
                                        _mm512_permutex2var_epi16(v[0][half], second, v[1][half]));
                }
            }
            MEMORY_BARRIER();
            _tile_loadd(4, hi, 64);
            _tile_loadd(5, lo, 64);
/* 16 dimensions (tile numbers are immediates): p_hi, then p_lo, against their values */
#define WEIGH_DIMS(T)                                                                                               \
    _tile_loadd(6, pairs[T], 64);                                                                                   \
    _tile_dpbf16ps(T, 4, 6);                                                                                        \
    _tile_dpbf16ps(T, 5, 6)
            WEIGH_DIMS(0);
            WEIGH_DIMS(1);
            WEIGH_DIMS(2);
            WEIGH_DIMS(3);
#undef WEIGH_DIMS
        }
        const int64_t stride = dim * (int64_t)sizeof(float);
        _tile_stored(0, acc + d0, stride);
        _tile_stored(1, acc + d0 + 16, stride);
        _tile_stored(2, acc + d0 + 32, stride);
        _tile_stored(3, acc + d0 + 48, stride);
    }
    _tile_release();
}
#else
int amx_attention_fit(int64_t group, int64_t dim) {
    (void)group, (void)dim;
    return 0;
}

void amx_weigh(const float *p, const uint16_t *values, int64_t context, const int64_t *path, int64_t n,
               int64_t padded, int64_t heads, int64_t dim, float *acc) {
    (void)p, (void)values, (void)context, (void)path, (void)n, (void)padded, (void)heads, (void)dim, (void)acc;
}

void amx_scores(const uint16_t *const *q, int64_t rows, const uint16_t *keys, int64_t context, const int64_t *path,
                int64_t n, int64_t padded, int64_t group, int64_t dim, float scale, float *scores) {
    (void)q, (void)rows, (void)keys, (void)context, (void)path, (void)n, (void)padded, (void)group, (void)dim,
        (void)scale, (void)scores;
}
#endif
