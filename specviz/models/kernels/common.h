/* specviz's C row kernels: what rowwise_linear.c and attend.c share. Compiled by specviz/models/kernels/__init__.py
   (one shared library per instruction set, the two .c files together), called through ctypes. */
#ifndef SPECVIZ_KERNELS_COMMON_H
#define SPECVIZ_KERNELS_COMMON_H

#include <immintrin.h>
#include <stdint.h>

/* the sum of v's 8 lanes: ((x0+x4)+(x2+x6)) + ((x1+x5)+(x3+x7)) */
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
