/* rowgemm.c's products on Intel's matrix units (AMX: Sapphire Rapids and later), isa 3.
 *
 * The same contract as every rowgemm path: out[m, n] = bf16(dot(x[m], w[n]) + bias[n]),
 * each row's bits a function of that row alone. Here a row's dot product is what the
 * tile unit's TDPBF16PS makes of it: the fp32 accumulator tile takes K in blocks of 16
 * pairs (32 values), block 0, 1, 2, ... in order, one instruction each; a row of the
 * tile never sees another row, and the number of rows configured for a tile (1 to 16)
 * changes nothing but how many rows are computed. Then the bias, then one rounding to
 * bf16 (VCVTNEPS2BF16), as on the AVX-512 path. So a one-row decode step and a 64-row
 * verify pass give a row the same bits, by construction, and `test_rowgemm.py` checks
 * it on the hardware.
 *
 * The bits are not isa 2's: measured on an Emerald Rapids Xeon, TDPBF16PS over 896
 * values differs from a chain of VDPBF16PS in ~85% of outputs (it rounds inside a block
 * differently). A machine runs one path for every pass, chosen once (`rowgemm_isa`).
 *
 * The packed stripes (rowgemm.c) are already the tile unit's layout for its B operand:
 * 16 consecutive pairs of 16 consecutive columns of a half stripe are a 16 x 64-byte
 * tile at a row stride of HALF * 4 bytes. x's rows are the A operand as they are. A K
 * that is not a multiple of 32 ends in a block padded with zeros (the same for every
 * row count).
 *
 * Linux hands out the tile state only to a process that asks (arch_prctl
 * ARCH_REQ_XCOMP_PERM); `amx_ready` asks once, and a refusal keeps isa 2. Attention on
 * the tile unit: amx_attention.c.
 */
#include "amx.h"

#include <stdlib.h>


#ifdef HAVE_AMX
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int amx_ready(void) {
    static int ready = -1;
    if (ready >= 0) return ready;
    __builtin_cpu_init();
    ready = 0;
    unsigned a, b, c, d; /* CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE (GCC 11's cpu_supports lacks them) */
    int tiles = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1);
    if (tiles && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")) {
        unsigned long granted = 0;
        if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 &&
            syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &granted) == 0 && (granted >> XFEATURE_XTILEDATA) & 1)
            ready = 1;
    }
    return ready;
}

/* Two shapes of work, both taking each row's K blocks in order (so both give a row the
 * same bits):
 *   one block of up to 16 rows against a whole stripe: sums tiles 0-3 (the stripe's four
 *   16-column blocks), rows tile 4, weight tiles 5 and 6 alternating;
 *   two blocks (up to 32 rows) against half a stripe at a time: sums tiles 0, 1 (rows
 *   block 0 x the half's two column blocks) and 2, 3 (rows block 1), rows tiles 4, 5,
 *   weight tiles 6, 7. Each weight tile is used twice, so a pass of up to 32 rows reads
 *   the weights once from memory (the one-block shape read them again from L2 for rows
 *   16-31, and did not hide the memory's latency behind that work). */
AMX static void configure(int rows0, int rows1) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64;
    if (rows1 == 0) { /* one block */
        for (int t = 0; t <= 4; t++) c.rows[t] = (uint8_t)rows0;
        c.rows[5] = c.rows[6] = BLOCK_PAIRS;
        c.colsb[7] = 0;
    } else {
        c.rows[0] = c.rows[1] = c.rows[4] = (uint8_t)rows0;
        c.rows[2] = c.rows[3] = c.rows[5] = (uint8_t)rows1;
        c.rows[6] = c.rows[7] = BLOCK_PAIRS;
    }
    _tile_loadconfig(&c);
}

/* The last `rest` pairs (fewer than a block) of `rows` rows, zero-padded to a whole
 * block, and of column block `blk` of a stripe: the same padding for every row count. */
static void tail_rows(const uint16_t *xr, int64_t ldx, int rows, int64_t whole, int64_t rest, uint16_t *a) {
    memset(a, 0, TILE_ROWS * BLOCK_PAIRS * 2 * sizeof *a);
    for (int i = 0; i < rows; i++) memcpy(a + i * BLOCK_PAIRS * 2, xr + i * ldx + 2 * whole, rest * 4);
}

static void tail_weights(const uint16_t *stripe, int64_t pairs, int64_t whole, int64_t rest, int blk, uint16_t *b) {
    memset(b, 0, BLOCK_PAIRS * LANES * 2 * sizeof *b);
    for (int64_t p = 0; p < rest; p++)
        memcpy(b + p * LANES * 2, stripe + stripe_at(pairs, whole + p, blk * LANES), LANES * 4);
}

#define PADDED (BLOCK_PAIRS * 4) /* bytes a row of a padded buffer */
/* 4: measured on the 2-core Emerald Rapids VM, 32 rows of 60 MLP products cycled
 * through memory (520 MB, past its 300 MB L3), medians of 15 interleaved rounds: 24.7 ms
 * against 27.0 without; one row 19.3 against 20.4; 8 and 16 steps no better. Prefetching
 * on into the next stripe (every line, while the second half of this one runs) lost:
 * 28.9 ms against 25.1 at 32 rows (whole 64-column rows of pairs; with
 * halves, an L2 prefetch 8-16 blocks further was within the noise; an AMX Xeon, 2026-11-27). */
#define PREFETCH_STEPS 4

/* Ask for the lines of a half stripe's block of pairs PREFETCH_STEPS blocks ahead (wp: the
 * half at pair p0; 2 KB in a row): a tile load waits for its lines, and the tile unit
 * has too few registers to run far ahead. */
static inline __attribute__((always_inline)) void prefetch_block(const uint16_t *wp, int64_t p0, int64_t whole) {
    if (PREFETCH_STEPS == 0 || p0 + PREFETCH_STEPS * BLOCK_PAIRS >= whole) return;
    const char *ahead = (const char *)(wp + PREFETCH_STEPS * BLOCK_PAIRS * HALF * 2);
    for (int l = 0; l < BLOCK_PAIRS * HALF * 4 / 64; l++) _mm_prefetch(ahead + l * 64, _MM_HINT_T0);
}

/* Pairs [begin, end) of K's `pairs`: the whole of K, or one span of a long K
 * (rowgemm_amx_spans). begin is a whole block; end too, unless it is `pairs`, whose last
 * block may be a zero-padded tail. A span that does not start at 0 continues the sums
 * an earlier span stored: the same instructions in the same order as one long loop. */
typedef struct {
    int64_t begin, end, pairs;
} Span;

static inline int64_t span_whole(Span k) { return k.end == k.pairs ? k.pairs / BLOCK_PAIRS * BLOCK_PAIRS : k.end; }

/* One block: rows m0..m0+rows-1 against one stripe into sums [rows][STRIPE]. */
AMX static void one_block(const uint16_t *x, int64_t ldx, const uint16_t *stripe, Span k, int64_t m0, int rows,
                          float *sums) {
    const int64_t pairs = k.pairs, whole = span_whole(k), wstride = HALF * 2 * sizeof(uint16_t);
    const int64_t sstride = STRIPE * sizeof(float);
    const uint16_t *xr = x + m0 * ldx;
    if (k.begin == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else { /* an earlier span's sums, stored exactly (fp32) */
        _tile_loadd(0, sums + 0 * LANES, sstride);
        _tile_loadd(1, sums + 1 * LANES, sstride);
        _tile_loadd(2, sums + 2 * LANES, sstride);
        _tile_loadd(3, sums + 3 * LANES, sstride);
    }
    for (int64_t p0 = k.begin; p0 < whole; p0 += BLOCK_PAIRS) {
        const uint16_t *w0 = stripe + stripe_at(pairs, p0, 0), *w1 = stripe + stripe_at(pairs, p0, HALF);
        prefetch_block(w0, p0, whole);
        prefetch_block(w1, p0, whole);
        _tile_loadd(4, xr + 2 * p0, ldx * (int64_t)sizeof(uint16_t));
        _tile_loadd(5, w0, wstride);
        _tile_loadd(6, w0 + LANES * 2, wstride);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(5, w1, wstride);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(6, w1 + LANES * 2, wstride);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 6);
    }
    if (whole < k.end) {
        uint16_t a[TILE_ROWS * BLOCK_PAIRS * 2], b[4][BLOCK_PAIRS * LANES * 2];
        tail_rows(xr, ldx, rows, whole, pairs - whole, a);
        for (int blk = 0; blk < 4; blk++) tail_weights(stripe, pairs, whole, pairs - whole, blk, b[blk]);
        MEMORY_BARRIER();
        _tile_loadd(4, a, PADDED);
        _tile_loadd(5, b[0], PADDED);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(5, b[1], PADDED);
        _tile_dpbf16ps(1, 4, 5);
        _tile_loadd(5, b[2], PADDED);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(5, b[3], PADDED);
        _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, sums + 0 * LANES, sstride);
    _tile_stored(1, sums + 1 * LANES, sstride);
    _tile_stored(2, sums + 2 * LANES, sstride);
    _tile_stored(3, sums + 3 * LANES, sstride);
}

/* Two blocks: rows m0..m0+15 and m0+16..m0+15+rows1 against one stripe, a half at a
 * time, into sums [16 + rows1][STRIPE]. */
AMX static void two_blocks(const uint16_t *x, int64_t ldx, const uint16_t *stripe, Span k, int64_t m0, int rows1,
                           float *sums) {
    const int64_t pairs = k.pairs, whole = span_whole(k), wstride = HALF * 2 * sizeof(uint16_t);
    const int64_t xstride = ldx * (int64_t)sizeof(uint16_t), sstride = STRIPE * sizeof(float);
    const uint16_t *x0 = x + m0 * ldx, *x1 = x0 + TILE_ROWS * ldx;
    for (int half = 0; half < 2; half++) {
        const int blk = 2 * half;
        float *s0 = sums + blk * LANES, *s1 = s0 + TILE_ROWS * STRIPE;
        if (k.begin == 0) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
        } else {
            _tile_loadd(0, s0, sstride);
            _tile_loadd(1, s0 + LANES, sstride);
            _tile_loadd(2, s1, sstride);
            _tile_loadd(3, s1 + LANES, sstride);
        }
        for (int64_t p0 = k.begin; p0 < whole; p0 += BLOCK_PAIRS) {
            const uint16_t *wp = stripe + stripe_at(pairs, p0, half * HALF);
            prefetch_block(wp, p0, whole);
            _tile_loadd(4, x0 + 2 * p0, xstride);
            _tile_loadd(6, wp, wstride);
            _tile_loadd(5, x1 + 2 * p0, xstride);
            _tile_loadd(7, wp + LANES * 2, wstride);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
        if (whole < k.end) {
            uint16_t a0[TILE_ROWS * BLOCK_PAIRS * 2], a1[TILE_ROWS * BLOCK_PAIRS * 2];
            uint16_t b0[BLOCK_PAIRS * LANES * 2], b1[BLOCK_PAIRS * LANES * 2];
            tail_rows(x0, ldx, TILE_ROWS, whole, pairs - whole, a0);
            tail_rows(x1, ldx, rows1, whole, pairs - whole, a1);
            tail_weights(stripe, pairs, whole, pairs - whole, blk, b0);
            tail_weights(stripe, pairs, whole, pairs - whole, blk + 1, b1);
            MEMORY_BARRIER();
            _tile_loadd(4, a0, PADDED);
            _tile_loadd(5, a1, PADDED);
            _tile_loadd(6, b0, PADDED);
            _tile_loadd(7, b1, PADDED);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, s0, sstride);
        _tile_stored(1, s0 + LANES, sstride);
        _tile_stored(2, s1, sstride);
        _tile_stored(3, s1 + LANES, sstride);
    }
}

/* bf16(sums + bias) of rows m0..m0+rows-1 into out's columns n0..n0+columns-1 */
AMX static void finish(const float *sums, const uint16_t *bias, uint16_t *out, int64_t ldo, int64_t m0, int rows,
                       int64_t n0, int64_t columns) {
    for (int b = 0; b < 4; b++) {
        int64_t c0 = b * LANES;
        if (c0 >= columns) break;
        __mmask16 keep = columns - c0 >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << (columns - c0)) - 1u);
        __m512 add = _mm512_setzero_ps();
        if (bias)
            add = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(keep, bias + n0 + c0)), 16));
        for (int i = 0; i < rows; i++) {
            __m256bh h = _mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(sums + i * STRIPE + c0), add));
            _mm256_mask_storeu_epi16(out + (m0 + i) * ldo + n0 + c0, keep, (__m256i)h);
        }
    }
}

/* Rows 0..M-1 against one stripe over span k, the sums of rows m0.. at SUMS (an
 * expression of m0), then the statement the caller defines as AFTER */
#define BLOCKS(k, SUMS)                                                                                             \
    for (int64_t m0 = 0; m0 < M;) {                                                                                 \
        int left = M - m0 < 2 * TILE_ROWS ? (int)(M - m0) : 2 * TILE_ROWS;                                         \
        int rows0 = left < TILE_ROWS ? left : TILE_ROWS, rows1 = left - rows0, shape = rows0 * 64 + rows1;         \
        if (shape != configured) configure(rows0, rows1), configured = shape;                                     \
        if (rows1)                                                                                                  \
            two_blocks(x, ldx, stripe, k, m0, rows1, SUMS);                                                         \
        else                                                                                                        \
            one_block(x, ldx, stripe, k, m0, rows0, SUMS);                                                          \
        AFTER;                                                                                                      \
        m0 += left;                                                                                                 \
    }

/* Rows 0..M-1 of x against one stripe, into out's columns n0..n0+columns-1, with the
 * tiles as *configured says they are (-1: not yet); updates it. */
AMX static void whole_stripe(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias,
                             uint16_t *out, int64_t ldo, int64_t M, int64_t pairs, int64_t n0, int64_t columns,
                             int *configuredp) {
    float sums[2 * TILE_ROWS * STRIPE];
    int configured = *configuredp;
    Span all = {0, pairs, pairs};
#define AFTER finish(sums, bias, out, ldo, m0, left, n0, columns)
    BLOCKS(all, sums)
#undef AFTER
    *configuredp = configured;
}

/* rowgemm.c's stripe call on the tile unit (one row's stripe for lmchoice.c): configures
 * the tiles itself (an OpenMP thread may never have used them) and releases them. */
AMX void stripe_amx(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias, uint16_t *out,
                    int64_t ldo, int64_t M, int64_t pairs, int64_t n0, int64_t columns) {
    int configured = -1;
    whole_stripe(x, ldx, stripe, bias, out, ldo, M, pairs, n0, columns, &configured);
    _tile_release();
}

/* rowgemm_bf16 on the tile unit: the stripes split among the threads as rowgemm.c's
 * loop splits them, each thread configuring its tiles once and releasing them when done
 * (LDTILECFG took ~120 ns on the AMX VM; a one-row step ran ~200 stripe calls a layer,
 * each configuring, ~2% of the step). */
AMX void rowgemm_amx(const uint16_t *x, int64_t ldx, const uint16_t *packed, const uint16_t *bias, uint16_t *out,
                     int64_t ldo, int64_t M, int64_t N, int64_t K) {
    int64_t stripes = (N + STRIPE - 1) / STRIPE, pairs = K / 2;
#pragma omp parallel
    {
        int configured = -1;
#pragma omp for schedule(static)
        for (int64_t s = 0; s < stripes; s++) {
            int64_t n0 = s * STRIPE, columns = N - n0 < STRIPE ? N - n0 : STRIPE;
            whole_stripe(x, ldx, packed + s * pairs * STRIPE * 2, bias, out, ldo, M, pairs, n0, columns, &configured);
        }
        _tile_release();
    }
}

/* A long K in spans of SPAN_PAIRS, every stripe's sums kept in fp32 between them, so a
 * span's rows (256 rows x 1,024 values: 512 KB) stay in L2 while every stripe passes
 * over them, where one pass over K read each 32-row block's 9.7 KB rows from L3 again
 * for every stripe (the MLP's down product: K = 4,864). The same instructions per
 * output in the same order as stripe_amx: the same bits. Returns -1 (nothing written)
 * where it does not pay (32 rows or fewer read the weights once anyway; K within one
 * span) or without memory for the sums. */
#define SPAN_PAIRS 512
AMX int rowgemm_amx_spans(const uint16_t *x, int64_t ldx, const uint16_t *packed, const uint16_t *bias, uint16_t *out,
                          int64_t ldo, int64_t M, int64_t N, int64_t K) {
    int64_t stripes = (N + STRIPE - 1) / STRIPE, pairs = K / 2;
    if (M <= 2 * TILE_ROWS || pairs <= SPAN_PAIRS) return -1;
    float *all = malloc((size_t)(stripes * M * STRIPE) * sizeof *all);
    if (!all) return -1;
    for (int64_t begin = 0; begin < pairs; begin += SPAN_PAIRS) {
        Span k = {begin, begin + SPAN_PAIRS < pairs ? begin + SPAN_PAIRS : pairs, pairs};
#pragma omp parallel
        {
            int configured = -1;
#pragma omp for schedule(static)
            for (int64_t s = 0; s < stripes; s++) {
                const uint16_t *stripe = packed + s * pairs * STRIPE * 2;
                float *sums = all + s * M * STRIPE;
#define AFTER (void)0
                BLOCKS(k, sums + m0 * STRIPE)
#undef AFTER
            }
            _tile_release();
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < stripes; s++) {
        int64_t n0 = s * STRIPE, columns = N - n0 < STRIPE ? N - n0 : STRIPE;
        for (int64_t m0 = 0; m0 < M; m0 += TILE_ROWS) {
            int rows = M - m0 < TILE_ROWS ? (int)(M - m0) : TILE_ROWS;
            finish(all + (s * M + m0) * STRIPE, bias, out, ldo, m0, rows, n0, columns);
        }
    }
    free(all);
    return 0;
}
#else
int amx_ready(void) { return 0; }

int rowgemm_amx_spans(const uint16_t *x, int64_t ldx, const uint16_t *packed, const uint16_t *bias, uint16_t *out,
                      int64_t ldo, int64_t M, int64_t N, int64_t K) {
    (void)x, (void)ldx, (void)packed, (void)bias, (void)out, (void)ldo, (void)M, (void)N, (void)K;
    return -1;
}

void stripe_amx(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias, uint16_t *out,
                int64_t ldo, int64_t M, int64_t pairs, int64_t n0, int64_t columns) {
    (void)x, (void)ldx, (void)stripe, (void)bias, (void)out, (void)ldo, (void)M, (void)pairs, (void)n0, (void)columns;
}

void rowgemm_amx(const uint16_t *x, int64_t ldx, const uint16_t *packed, const uint16_t *bias, uint16_t *out,
                 int64_t ldo, int64_t M, int64_t N, int64_t K) {
    (void)x, (void)ldx, (void)packed, (void)bias, (void)out, (void)ldo, (void)M, (void)N, (void)K;
}
#endif
