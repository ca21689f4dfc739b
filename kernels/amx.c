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
 * 16 consecutive pairs of 16 consecutive columns are a 16 x 64-byte tile at a row stride
 * of STRIPE * 4 bytes. x's rows are the A operand as they are. A K that is not a
 * multiple of 32 ends in a block padded with zeros (the same for every row count).
 *
 * Linux hands out the tile state only to a process that asks (arch_prctl
 * ARCH_REQ_XCOMP_PERM); `amx_ready` asks once, and a refusal keeps isa 2.
 */
#include "bf16.h"

#define STRIPE 64
#define LANES 16
#define BLOCK_PAIRS 16 /* pairs of k per tile instruction */
#define TILE_ROWS 16

/* GCC 11 and clang 12 brought the tile intrinsics; an older compiler builds isa 2 alone */
#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

int amx_ready(void) {
    static int ready = -1;
    if (ready >= 0) return ready;
    __builtin_cpu_init();
    ready = 0;
    if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
        __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")) {
        unsigned long granted = 0;
        if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 &&
            syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &granted) == 0 && (granted >> XFEATURE_XTILEDATA) & 1)
            ready = 1;
    }
    return ready;
}

/* Tiles 0-3: the fp32 sums of `rows` rows x 16 columns each (a stripe's four column
 * blocks); 4: `rows` rows of x, one block of pairs; 5, 6: weight blocks, alternating. */
AMX static void configure(int rows) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t <= 4; t++) c.rows[t] = (uint8_t)rows, c.colsb[t] = 64;
    for (int t = 5; t <= 6; t++) c.rows[t] = BLOCK_PAIRS, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* The sums of rows m0..m0+rows-1 against one stripe into sums [rows][STRIPE]. */
AMX static void block_sums(const uint16_t *x, int64_t ldx, const uint16_t *stripe, int64_t pairs, int64_t m0,
                           int rows, float *sums) {
    const int64_t whole = pairs / BLOCK_PAIRS * BLOCK_PAIRS, wstride = STRIPE * 2 * sizeof(uint16_t);
    const uint16_t *xr = x + m0 * ldx;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t p0 = 0; p0 < whole; p0 += BLOCK_PAIRS) {
        const uint16_t *wp = stripe + p0 * STRIPE * 2;
        _tile_loadd(4, xr + 2 * p0, ldx * (int64_t)sizeof(uint16_t));
        _tile_loadd(5, wp, wstride);
        _tile_loadd(6, wp + 1 * LANES * 2, wstride);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(5, wp + 2 * LANES * 2, wstride);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(6, wp + 3 * LANES * 2, wstride);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 6);
    }
    if (whole < pairs) { /* the last pairs, zero-padded to a whole block */
        int64_t rest = pairs - whole;
        uint16_t a[TILE_ROWS * BLOCK_PAIRS * 2], b[4][BLOCK_PAIRS * LANES * 2];
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        for (int i = 0; i < rows; i++) memcpy(a + i * BLOCK_PAIRS * 2, xr + i * ldx + 2 * whole, rest * 4);
        for (int64_t p = 0; p < rest; p++)
            for (int blk = 0; blk < 4; blk++)
                memcpy(b[blk] + p * LANES * 2, stripe + ((whole + p) * STRIPE + blk * LANES) * 2, LANES * 4);
        /* GCC's tileloadd tells the compiler of no memory read: without this the
         * copies above may be dropped as dead (they were: NaNs at -O3) */
        __asm__ volatile("" ::: "memory");
        _tile_loadd(4, a, BLOCK_PAIRS * 4);
        _tile_loadd(5, b[0], LANES * 4);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(5, b[1], LANES * 4);
        _tile_dpbf16ps(1, 4, 5);
        _tile_loadd(5, b[2], LANES * 4);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(5, b[3], LANES * 4);
        _tile_dpbf16ps(3, 4, 5);
    }
    const int64_t sstride = STRIPE * sizeof(float);
    _tile_stored(0, sums + 0 * LANES, sstride);
    _tile_stored(1, sums + 1 * LANES, sstride);
    _tile_stored(2, sums + 2 * LANES, sstride);
    _tile_stored(3, sums + 3 * LANES, sstride);
}

/* rowgemm.c's stripe call on the tile unit: rows 0..M-1 of x against one stripe, into
 * out's columns n0..n0+columns-1. Configures the tiles itself (an OpenMP thread may
 * never have used them) and releases them on return. */
AMX void stripe_amx(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias, uint16_t *out,
                    int64_t ldo, int64_t M, int64_t pairs, int64_t n0, int64_t columns) {
    float sums[TILE_ROWS * STRIPE];
    int configured = 0;
    for (int64_t m0 = 0; m0 < M; m0 += TILE_ROWS) {
        int rows = M - m0 < TILE_ROWS ? (int)(M - m0) : TILE_ROWS;
        if (rows != configured) configure(rows), configured = rows;
        block_sums(x, ldx, stripe, pairs, m0, rows, sums);
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
    _tile_release();
}
#else
int amx_ready(void) { return 0; }

void stripe_amx(const uint16_t *x, int64_t ldx, const uint16_t *stripe, const uint16_t *bias, uint16_t *out,
                int64_t ldo, int64_t M, int64_t pairs, int64_t n0, int64_t columns) {
    (void)x, (void)ldx, (void)stripe, (void)bias, (void)out, (void)ldo, (void)M, (void)pairs, (void)n0, (void)columns;
}
#endif
