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

/* e^x by Cephes' expf, its constants for rowdecoder.c's exp16 and attend_avx2.c's exp8:
 * the clamp, log2(e), ln 2 in two parts, and the polynomial's coefficients, highest first */
#define EXP_MAX 88.3762626647949f
#define EXP_MIN (-87.3365447505531f)
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
#define EXP_TERMS 6
static const float EXP_POLY[EXP_TERMS] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                                          4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default"))) /* AVX2: the AVX2-only CPUs rowgemm serves */
#else
#define CLONES
#endif
#endif
