/* What packed_linear.c and llama.c share: the packed matmul called from inside a parallel region, the row-wise
   attention of attend.c, and 8-lane bf16 <-> fp32 helpers (the same code in every build, so the same bits). */
#ifndef SPECVIZ_KERNELS_PACKED_H
#define SPECVIZ_KERNELS_PACKED_H

#include "common.h"

/* what packed_matmul does with an output: store it rounded to bf16; add it (rounded) to the bf16 already there and
   round the sum, as torch's `x + linear(y)` in bf16 does; store its bf16 rounding as fp32 (logits) */
enum { STORE_BF16 = 0, ADD_BF16 = 1, STORE_F32 = 2 };

/* x as the packed matmul reads it: bf16 pairs in the AVX512-BF16 build (vdpbf16ps takes them as they are), fp32 in
   the others (widened once, where the matmul's inner loop broadcasts each value from memory) */
#if defined(__AVX512BF16__)
typedef uint16_t xin_t;
#else
typedef float xin_t;
#endif

/* y (M, N) = x (M, K), rows ldx apart . W^T, W (N, K) packed by pack_bf16; y's rows ldy apart: the column groups
   g0 .. g1-1 only (a group: 32 outputs, packed_groups(N) of them), so threads can share a matmul's groups. */
void packed_matmul(const xin_t *x, long ldx, const uint16_t *packed, long M, long K, long N, void *y, long ldy,
                   int mode, long g0, long g1);

static inline long packed_groups(long N) { return (N + 31) / 32; }

/* y (M, N) = x (M, K) bf16 . W^T on `threads` OpenMP threads (packed_linear.c) */
void linear_packed(const uint16_t *x, const uint16_t *packed, void *y, long M, long K, long N, int mode, int threads);

/* Work sharing without barriers: a phase is `count` chunks that threads claim one at a time; a thread waits only for
   chunks claimed and not yet finished before it starts the next phase, never for a thread that has not arrived (on
   shared cores a descheduled thread would hold an OpenMP barrier for a whole time slice; here the others take its
   work). Which thread runs a chunk never changes a bit. */
typedef struct { long next, done, pad[6]; } phase_t;  /* one cache line each */

/* RUN_PHASE(phase, chunks, c, work): every thread runs `work` for the chunks c it claims, then waits for the rest */
#define RUN_PHASE(ph, count, c, ...) do {                                                       \
        long c;                                                                                  \
        while ((c = __atomic_fetch_add(&(ph)->next, 1, __ATOMIC_RELAXED)) < (count)) {          \
            __VA_ARGS__;                                                                         \
            __atomic_fetch_add(&(ph)->done, 1, __ATOMIC_RELEASE);                                \
        }                                                                                        \
        PHASE_WAITED(wait_phase(ph, count));                                                     \
    } while (0)

/* What a unit does with the nanoseconds a RUN_PHASE waited (0 unless -DPHASE_TIMES): nothing, unless it defines
   PHASE_WAITED before including this header (llama.c adds them to its phase timers). So wait_phase calls no other
   unit: the call graph between the .c files has no circle. */
#ifndef PHASE_WAITED
#define PHASE_WAITED(ns) ((void)(ns))
#endif

double wait_phase(phase_t *ph, long count);  /* returns the nanoseconds it waited under -DPHASE_TIMES, else 0 */

#ifdef PHASE_TIMES  /* experiments/probes/phase_times.py: llama.c times each phase, wait_phase its waits */
#include <time.h>
static inline double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
#endif

void attend_bf16(const float *q, const uint16_t *k, const uint16_t *v, float *out, const int32_t *idx,
                 const int64_t *off, long R, long H, long KVH, long D, long hs, float scale, int threads);
void attend_task(const float *q, const uint16_t *kh, const uint16_t *vh, float *out, const int32_t *ix, long n,
                 long h0, long h1, long D, float scale, float *s, long room, const uint32_t *tiles, long shared);
long key_tiles_for(long rows, long common, long D);
#if defined(__AVX512BF16__)
#define HAVE_KEY_TILES  /* attend.c lays keys out a key a lane (key_tiles) */
#endif
void key_tiles(const uint16_t *kh, const int32_t *ix, long g, long D, uint32_t *tiles);

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

/* fp32 -> bf16, round to nearest even (torch's rounding), NaN -> 0x7fc0 */
static inline uint16_t float_to_bf16(float f) {
    uint32_t b;
    __builtin_memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* a bf16 value as the packed matmul reads it (xin_t) */
static inline xin_t x_of_bf16(uint16_t h) {
#if defined(__AVX512BF16__)
    return h;
#else
    return bf16_to_float(h);
#endif
}

/* 8 bf16 -> 8 fp32 */
static inline __m256 load8_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* each lane rounded to bf16 (nearest even), kept as fp32: what torch's bf16 result of an fp32 computation holds */
static inline __m256 round8_bf16(__m256 v) {
    __m256i bits = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    bits = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32((int)0xffff0000u)));
}

/* 8 fp32 already rounded to bf16 (round8_bf16) -> 8 bf16 */
static inline void store8_bf16(uint16_t *p, __m256 rounded) {
    __m256i high = _mm256_srli_epi32(_mm256_castps_si256(rounded), 16);
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(packed));
}

/* 8 fp32 already rounded to bf16 -> 8 values of x as the packed matmul reads it (xin_t) */
static inline void store8_x(xin_t *p, __m256 rounded) {
#if defined(__AVX512BF16__)
    store8_bf16(p, rounded);
#else
    _mm256_storeu_ps(p, rounded);
#endif
}

#endif
