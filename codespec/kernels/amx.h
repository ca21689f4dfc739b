/* What amx.c (products) and amx_attention.c (attention) share: the tile unit's
 * availability test, its configuration record, and the compiler's view of its loads. */
#ifndef CODESPEC_AMX_H
#define CODESPEC_AMX_H
#include "bf16.h"

#define LANES 16
#define BLOCK_PAIRS 16 /* pairs of k per tile instruction */
#define TILE_ROWS 16

/* GCC 11 and clang 12 brought the tile intrinsics; an older compiler builds isa 2 alone */
#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define HAVE_AMX 1
#include <immintrin.h>

#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

/* GCC's tileloadd tells the compiler of no memory read: without this barrier copies
 * into a local buffer just before a tile load may be dropped as dead (they were: NaNs
 * at -O3) */
#define MEMORY_BARRIER() __asm__ volatile("" ::: "memory")
#endif
#endif
