/* GCC vector types of 16 lanes and the clone attribute, for codespec's C kernels that
 * spell their arithmetic in vector extensions (rowdecoder.c, int8.c, lmchoice.c). With
 * -ffp-contract=off both clones (AVX-512, baseline) compute the same bits. */
#ifndef CODESPEC_LANES_H
#define CODESPEC_LANES_H
#include <stdint.h>

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define CLONES
#endif
#endif
