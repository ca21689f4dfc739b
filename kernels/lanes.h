/* GCC vector types of 16 lanes, the lane helpers and the clone attribute, for codespec's
 * C kernels that spell their arithmetic in vector extensions (rowdecoder.c, int8.c,
 * lmchoice.c). With -ffp-contract=off both clones (AVX-512, baseline) compute the same
 * bits. */
#ifndef CODESPEC_LANES_H
#define CODESPEC_LANES_H
#include <stdint.h>
#include <string.h>

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

#define LANE static inline __attribute__((always_inline))

LANE v16f splat(float x) { return (v16f){0} + x; }

LANE v16f load(const float *p) { /* 16 floats, any alignment */
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

LANE v16f widen(const uint16_t *p) { /* 16 bf16 -> fp32, exact */
    v16h h;
    memcpy(&h, p, sizeof h);
    return (v16f)(__builtin_convertvector(h, v16u) << 16);
}

LANE v16f pick(v16i mask, v16f yes, v16f no) { return (v16f)(((v16i)yes & mask) | ((v16i)no & ~mask)); }

LANE v16f absolute(v16f v) { return (v16f)((v16i)v & 0x7fffffff); }

#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default"))) /* AVX2: the AVX2-only CPUs rowgemm serves */
#else
#define CLONES
#endif
#endif
