/* A row-invariant bf16 matmul over weights packed once at load (pack_bf16, packed_matmul, linear_packed).

Layout: the weight (N, K) in blocks of 16 output rows (N padded with zero rows to a multiple of 16); inside a block,
for each pair p of input columns, 16 words: word j = w[16b + j][2p] | w[16b + j][2p + 1] << 16. A block is K * 32
contiguous bytes, read front to back, so a pass streams the weights at the memory's pace for any number of rows.

Every output y[r][n] is one accumulator in one fp32 lane that takes the pairs p = 0, 1, ... K/2 - 1 in order, then
is rounded once to bf16. Which rows or blocks share a pass (1 to 8 rows, 1 or 2 blocks) only decides which registers
hold it: a row's bits never depend on the other rows, so one token fed alone or with drafts gets the same logits.
Builds: AVX512-BF16 takes each pair with one vdpbf16ps (x's pair broadcast); AVX-512F and AVX2 widen the pair to
fp32 and take its even then its odd product with FMA (those two builds give the same bits; the BF16 build its own). */
#include <sched.h>

#include "packed.h"

/* W (N, K) bf16 -> packed (NB * 16 * K): blocks of 16 rows, pairs of columns interleaved (see above). K even. */
void pack_bf16(const uint16_t *w, uint16_t *packed, long N, long K, int threads) {
    long P = K / 2, NB = (N + 15) / 16;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long b = 0; b < NB; ++b)
        for (long p = 0; p < P; ++p)
            for (long j = 0; j < 16; ++j) {
                long n = 16 * b + j;
                uint16_t *dst = packed + ((b * P + p) * 16 + j) * 2;
                dst[0] = n < N ? w[n * K + 2 * p] : 0;
                dst[1] = n < N ? w[n * K + 2 * p + 1] : 0;
            }
}

static inline uint32_t pair_at(const uint16_t *x) {
    uint32_t word;
    __builtin_memcpy(&word, x, 4);
    return word;
}

/* Software prefetch of the weights: PREFETCH_LINES 64-byte lines ahead of the one a pass reads, with PREFETCH_HINT, in
   passes of at least PREFETCH_MIN_ROWS rows (each a -D flag: experiments/probes/prefetch_ab.py builds variants). The
   AVX512-BF16 build prefetches 64 lines into L2 for every pass: on a 2-core Zen 4 EPYC, the target's 30 layers,
   interleaved against the former 16 lines into L1 for passes of more than 4 rows, took 7% off one row and 8-16% off
   2-16 rows (results/prefetch_ab-avx512bf16.txt). The AVX-512F build keeps the former setting (k=8 rows, 2 cores:
   16.6 ms a forward against 22.0 without); AVX2 prefetches nothing. */
#if defined(__AVX512BF16__)
#define PREFETCH_LINES_BUILD 64
#define PREFETCH_MIN_ROWS_BUILD 1
#define PREFETCH_HINT_BUILD _MM_HINT_T1
#else
#define PREFETCH_LINES_BUILD 16
#define PREFETCH_MIN_ROWS_BUILD 5
#define PREFETCH_HINT_BUILD _MM_HINT_T0
#endif
#ifndef PREFETCH_LINES
#define PREFETCH_LINES PREFETCH_LINES_BUILD
#endif
#ifndef PREFETCH_MIN_ROWS
#define PREFETCH_MIN_ROWS PREFETCH_MIN_ROWS_BUILD
#endif
#ifndef PREFETCH_HINT
#define PREFETCH_HINT PREFETCH_HINT_BUILD
#endif

/* k<B>_<R>: B blocks (16 outputs each) for R rows of x (ldx apart) over all P pairs; tile[r][b * 16 + j] = the fp32
   accumulator of row r, output 16 b + j. */
#if defined(__AVX512BF16__)
#define ROWS 8
#define KERNEL(B, R) static void k##B##_##R(const uint16_t *x, long ldx, const uint32_t *w, long P, float *tile) { \
    __m512 acc[B][R];                                                                                        \
    for (int b = 0; b < B; ++b)                                                                              \
        for (int r = 0; r < R; ++r) acc[b][r] = _mm512_setzero_ps();                                         \
    for (long p = 0; p < P; ++p) {                                                                           \
        __m512i xv[R];                                                                                       \
        for (int r = 0; r < R; ++r) xv[r] = _mm512_set1_epi32((int)pair_at(x + r * ldx + 2 * p));            \
        for (int b = 0; b < B; ++b) {                                                                        \
            if (R >= PREFETCH_MIN_ROWS) /* the weights' loads alone do not keep enough lines in flight */     \
                _mm_prefetch((const char *)(w + (b * P + p + PREFETCH_LINES) * 16), PREFETCH_HINT);            \
            __m512i wv = _mm512_loadu_si512((const void *)(w + (b * P + p) * 16));                           \
            for (int r = 0; r < R; ++r)                                                                      \
                acc[b][r] = _mm512_dpbf16_ps(acc[b][r], (__m512bh)wv, (__m512bh)xv[r]);                      \
        }                                                                                                    \
    }                                                                                                        \
    for (int b = 0; b < B; ++b)                                                                              \
        for (int r = 0; r < R; ++r) _mm512_storeu_ps(tile + r * (B * 16) + b * 16, acc[b][r]);               \
}
#elif defined(__AVX512F__)
#define ROWS 8
#define KERNEL(B, R) static void k##B##_##R(const uint16_t *x, long ldx, const uint32_t *w, long P, float *tile) { \
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);                                                \
    __m512 acc[B][R];                                                                                        \
    for (int b = 0; b < B; ++b)                                                                              \
        for (int r = 0; r < R; ++r) acc[b][r] = _mm512_setzero_ps();                                         \
    for (long p = 0; p < P; ++p) {                                                                           \
        __m512 xe[R], xo[R];                                                                                 \
        for (int r = 0; r < R; ++r) {                                                                        \
            uint32_t pair = pair_at(x + r * ldx + 2 * p);                                                    \
            xe[r] = _mm512_castsi512_ps(_mm512_set1_epi32((int)(pair << 16)));                               \
            xo[r] = _mm512_castsi512_ps(_mm512_set1_epi32((int)(pair & 0xffff0000u)));                        \
        }                                                                                                    \
        for (int b = 0; b < B; ++b) {                                                                        \
            if (R >= PREFETCH_MIN_ROWS) /* the weights' loads alone do not keep enough lines in flight */     \
                _mm_prefetch((const char *)(w + (b * P + p + PREFETCH_LINES) * 16), PREFETCH_HINT);            \
            __m512i wv = _mm512_loadu_si512((const void *)(w + (b * P + p) * 16));                           \
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(wv, 16));                                      \
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(wv, high));                                     \
            for (int r = 0; r < R; ++r) {                                                                    \
                acc[b][r] = _mm512_fmadd_ps(we, xe[r], acc[b][r]);                                           \
                acc[b][r] = _mm512_fmadd_ps(wo, xo[r], acc[b][r]);                                           \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
    for (int b = 0; b < B; ++b)                                                                              \
        for (int r = 0; r < R; ++r) _mm512_storeu_ps(tile + r * (B * 16) + b * 16, acc[b][r]);               \
}
#else
#define ROWS 4  /* 16 registers: 2 halves x B blocks x R rows accumulators */
#define KERNEL(B, R) static void k##B##_##R(const uint16_t *x, long ldx, const uint32_t *w, long P, float *tile) { \
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);                                                \
    __m256 acc[B][2][R];                                                                                     \
    for (int b = 0; b < B; ++b)                                                                              \
        for (int h = 0; h < 2; ++h)                                                                          \
            for (int r = 0; r < R; ++r) acc[b][h][r] = _mm256_setzero_ps();                                  \
    for (long p = 0; p < P; ++p) {                                                                           \
        __m256 xe[R], xo[R];                                                                                 \
        for (int r = 0; r < R; ++r) {                                                                        \
            uint32_t pair = pair_at(x + r * ldx + 2 * p);                                                    \
            xe[r] = _mm256_castsi256_ps(_mm256_set1_epi32((int)(pair << 16)));                               \
            xo[r] = _mm256_castsi256_ps(_mm256_set1_epi32((int)(pair & 0xffff0000u)));                        \
        }                                                                                                    \
        for (int b = 0; b < B; ++b)                                                                          \
            for (int h = 0; h < 2; ++h) {                                                                    \
                __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (b * P + p) * 16 + 8 * h));            \
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));                                  \
                __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(wv, high));                                 \
                for (int r = 0; r < R; ++r) {                                                                \
                    acc[b][h][r] = _mm256_fmadd_ps(we, xe[r], acc[b][h][r]);                                 \
                    acc[b][h][r] = _mm256_fmadd_ps(wo, xo[r], acc[b][h][r]);                                 \
                }                                                                                            \
            }                                                                                                \
    }                                                                                                        \
    for (int b = 0; b < B; ++b)                                                                              \
        for (int h = 0; h < 2; ++h)                                                                          \
            for (int r = 0; r < R; ++r) _mm256_storeu_ps(tile + r * (B * 16) + b * 16 + 8 * h, acc[b][h][r]); \
}
#endif

typedef void (*kernel_fn)(const uint16_t *, long, const uint32_t *, long, float *);

KERNEL(1, 1) KERNEL(1, 2) KERNEL(1, 3) KERNEL(1, 4) KERNEL(2, 1) KERNEL(2, 2)
#if ROWS == 8
KERNEL(1, 5) KERNEL(1, 6) KERNEL(1, 7) KERNEL(1, 8) KERNEL(2, 3) KERNEL(2, 4)
static const kernel_fn ONE[9] = {0, k1_1, k1_2, k1_3, k1_4, k1_5, k1_6, k1_7, k1_8};
#if defined(__AVX512BF16__)  /* 16 accumulators, 8 broadcast pairs: two blocks a pass for up to 8 rows */
KERNEL(2, 5) KERNEL(2, 6) KERNEL(2, 7) KERNEL(2, 8)
static const kernel_fn TWO[9] = {0, k2_1, k2_2, k2_3, k2_4, k2_5, k2_6, k2_7, k2_8};
#else  /* widened pairs take twice the registers: past 4 rows, one block a pass */
static const kernel_fn TWO[9] = {0, k2_1, k2_2, k2_3, k2_4, 0, 0, 0, 0};
#endif
#else
static const kernel_fn ONE[5] = {0, k1_1, k1_2, k1_3, k1_4};
static const kernel_fn TWO[5] = {0, k2_1, k2_2, 0, 0};
#endif

/* the tile's R x width outputs (rows m0.., columns n0..) into y as `mode` says: 8 at a time, then one at a time past
   the last full 8 below N (which path a column takes depends on the column alone, never on the rows) */
static void finish(const float *tile, long R, long width, long m0, long n0, long N, void *y, long ldy, int mode) {
    long vector = N - n0 < width ? (N - n0) / 8 * 8 : width;
    for (long r = 0; r < R; ++r) {
        const float *t = tile + r * width;
        long at = (m0 + r) * ldy + n0, j = 0;
        for (; j < vector; j += 8) {
            __m256 v = round8_bf16(_mm256_loadu_ps(t + j));
            if (mode == STORE_F32) {
                _mm256_storeu_ps((float *)y + at + j, v);
            } else {
                uint16_t *out = (uint16_t *)y + at + j;
                store8_bf16(out, mode == ADD_BF16 ? round8_bf16(_mm256_add_ps(load8_bf16(out), v)) : v);
            }
        }
        for (; j < width && n0 + j < N; ++j) {
            uint16_t rounded = float_to_bf16(t[j]);
            if (mode == STORE_F32) {
                ((float *)y)[at + j] = bf16_to_float(rounded);
            } else {
                uint16_t *out = (uint16_t *)y + at + j;
                *out = mode == ADD_BF16 ? float_to_bf16(bf16_to_float(*out) + bf16_to_float(rounded)) : rounded;
            }
        }
    }
}

void packed_matmul(const uint16_t *x, long ldx, const uint16_t *packed, long M, long K, long N, void *y, long ldy,
                   int mode, long g0, long g1) {
    long P = K / 2, NB = (N + 15) / 16;
    const uint32_t *w = (const uint32_t *)packed;
    for (long g = g0; g < g1; ++g) {  /* two blocks (32 outputs) a group; each streams its blocks once */
        float tile[ROWS * 32];
        long b0 = 2 * g, nb = NB - b0 < 2 ? NB - b0 : 2;
        for (long m0 = 0; m0 < M; m0 += ROWS) {
            long R = M - m0 < ROWS ? M - m0 : ROWS;
            const uint16_t *xr = x + m0 * ldx;
            if (nb == 2 && TWO[R]) {
                TWO[R](xr, ldx, w + b0 * P * 16, P, tile);
                finish(tile, R, 32, m0, b0 * 16, N, y, ldy, mode);
            } else {
                for (long b = b0; b < b0 + nb; ++b) {
                    ONE[R](xr, ldx, w + b * P * 16, P, tile);
                    finish(tile, R, 16, m0, b * 16, N, y, ldy, mode);
                }
            }
        }
    }
}

void wait_phase(phase_t *ph, long count) {
    for (long spins = 0; __atomic_load_n(&ph->done, __ATOMIC_ACQUIRE) < count; ++spins) {
        if (spins < 2000) _mm_pause(); else sched_yield();
    }
}

#define CHUNK 4  /* groups a claim */

/* y (M, N) = x (M, K) bf16 . W^T with W packed by pack_bf16, on `threads` OpenMP threads; mode: see packed.h */
void linear_packed(const uint16_t *x, const uint16_t *packed, void *y, long M, long K, long N, int mode, int threads) {
    phase_t phase = {0, 0, {0}};
    long groups = packed_groups(N), chunks = (groups + CHUNK - 1) / CHUNK;
    #pragma omp parallel num_threads(threads)
    RUN_PHASE(&phase, chunks, c, {
        long g1 = (c + 1) * CHUNK < groups ? (c + 1) * CHUNK : groups;
        packed_matmul(x, K, packed, M, K, N, y, N, mode, c * CHUNK, g1);
    });
}
