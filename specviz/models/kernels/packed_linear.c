/* A row-invariant bf16 matmul over weights packed once at load (pack_bf16, packed_matmul, linear_packed).

Layout: the weight (N, K) in blocks of 16 output rows (N padded with zero rows to a multiple of 16); inside a block,
for each pair p of input columns, 16 words: word j = w[16b + j][2p] | w[16b + j][2p + 1] << 16. A block is K * 32
contiguous bytes, read front to back, so a pass streams the weights at the memory's pace for any number of rows.

Every output y[r][n] is one accumulator in one fp32 lane that takes the pairs p = 0, 1, ... K/2 - 1 in order, then
is rounded once to bf16. Which rows or blocks share a pass (AVX2: 1 to 5 rows; AVX-512: up to 8 or 16; 1 or 2 blocks),
and whether the pairs go in one stretch or in slices, only decide which registers hold it between which pairs: a
row's bits never depend on the other rows, so one token fed alone or with drafts gets the same logits.
Builds: AVX512-BF16 takes each pair with one vdpbf16ps (x's pair broadcast); AVX-512F and AVX2 take x widened to fp32
once (xin_t, packed.h), widen the weights' pair and take its even then its odd product with FMA (those two builds give
the same bits; the BF16 build its own). */
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

static inline int pair_at(const uint16_t *x) {
    int word;
    __builtin_memcpy(&word, x, 4);
    return word;
}

/* Software prefetch of the weights: PREFETCH_LINES 64-byte lines ahead of the one a pass reads, with PREFETCH_HINT, in
   passes of at least PREFETCH_MIN_ROWS rows (each a -D flag: experiments/probes/prefetch_ab.py builds variants). The
   AVX512-BF16 and AVX2 builds prefetch 64 lines into L2 for every pass, the setting measured fastest for them
   (results/prefetch_ab-avx512bf16.txt, results/kernel_ab-avx2-on-zen4.txt); the AVX-512F build, whose own CPUs were
   not measured, 16 lines into L1 for passes of more than 4 rows (experiments/LOG.md has the runs). */
#if defined(__AVX512BF16__)
#define PREFETCH_LINES_BUILD 64
#define PREFETCH_MIN_ROWS_BUILD 1
#define PREFETCH_HINT_BUILD _MM_HINT_T1
#elif defined(__AVX512F__)
#define PREFETCH_LINES_BUILD 16
#define PREFETCH_MIN_ROWS_BUILD 5
#define PREFETCH_HINT_BUILD _MM_HINT_T0
#else
#define PREFETCH_LINES_BUILD 64
#define PREFETCH_MIN_ROWS_BUILD 1
#define PREFETCH_HINT_BUILD _MM_HINT_T1
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
#define PREFETCH(R, address) \
    do { if ((R) >= PREFETCH_MIN_ROWS) _mm_prefetch((const char *)(address), PREFETCH_HINT); } while (0)

/* k<B>_<R>: B blocks (16 outputs each, the first at w, the next P * 16 words on) for R rows of x (ldx apart), the pairs
   p0 .. p1-1; tile[r * ldt + b * 16 + j]: the fp32 accumulator of row r, output 16 b + j, zero before pair 0 and
   taken up where it was for p0 > 0. A tile holds its R x B accumulators in registers for the whole pass; each pair's
   weights are loaded once and serve every row; each row's x is broadcast from memory (a load, not a shuffle:
   vbroadcastss, vpbroadcastd or an embedded {1to16} operand). */
#define UNROLL _Pragma("GCC unroll 16")  /* every row and block loop of a tile: its accumulators stay in registers */
#define KERNEL_HEAD(B, R) \
    static void k##B##_##R(const xin_t *x, long ldx, const uint32_t *w, long P, long p0, long p1, float *tile, \
                           long ldt, long ahead)
#if defined(__AVX512BF16__)
#define ROWS_BUILD 8      /* rows a pass at most (16, and 12 with two blocks, fit; passes of 8 ran faster) */
#define TWO_ROWS_BUILD 8  /* rows a pass of two blocks at most: 2 R accumulators + 2 weights of 32 registers */
#define KERNEL(B, R) KERNEL_HEAD(B, R) {                                                                         \
    __m512 acc[R][B];                                                                                        \
    UNROLL for (int r = 0; r < R; ++r)                                                                       \
        UNROLL for (int b = 0; b < B; ++b)                                                                   \
            acc[r][b] = p0 ? _mm512_loadu_ps(tile + r * ldt + b * 16) : _mm512_setzero_ps();                 \
    for (long p = p0; p < p1; ++p) {                                                                         \
        __m512i wv[B];                                                                                       \
        UNROLL for (int b = 0; b < B; ++b) {                                                                 \
            PREFETCH(R, w + (b * P + p + ahead) * 16);                                                       \
            wv[b] = _mm512_loadu_si512((const void *)(w + (b * P + p) * 16));                                \
        }                                                                                                    \
        UNROLL for (int r = 0; r < R; ++r) {                                                                 \
            __m512i xv = _mm512_set1_epi32(pair_at(x + r * ldx + 2 * p));                                     \
            UNROLL for (int b = 0; b < B; ++b)                                                               \
                acc[r][b] = _mm512_dpbf16_ps(acc[r][b], (__m512bh)wv[b], (__m512bh)xv);                      \
        }                                                                                                    \
    }                                                                                                        \
    UNROLL for (int r = 0; r < R; ++r)                                                                       \
        UNROLL for (int b = 0; b < B; ++b) _mm512_storeu_ps(tile + r * ldt + b * 16, acc[r][b]);             \
}
#elif defined(__AVX512F__)
#define ROWS_BUILD 16
#define TWO_ROWS_BUILD 4  /* 2 R accumulators + 4 widened weights: up to 12 fit, but 2 x 4 and 1 x 8-16 ran faster */
#define KERNEL(B, R) KERNEL_HEAD(B, R) {                                                                         \
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);                                                \
    __m512 acc[R][B];                                                                                        \
    UNROLL for (int r = 0; r < R; ++r)                                                                       \
        UNROLL for (int b = 0; b < B; ++b)                                                                   \
            acc[r][b] = p0 ? _mm512_loadu_ps(tile + r * ldt + b * 16) : _mm512_setzero_ps();                 \
    for (long p = p0; p < p1; ++p) {                                                                         \
        __m512 we[B], wo[B];                                                                                 \
        UNROLL for (int b = 0; b < B; ++b) {                                                                 \
            PREFETCH(R, w + (b * P + p + ahead) * 16);                                                       \
            __m512i wv = _mm512_loadu_si512((const void *)(w + (b * P + p) * 16));                           \
            we[b] = _mm512_castsi512_ps(_mm512_slli_epi32(wv, 16));                                          \
            wo[b] = _mm512_castsi512_ps(_mm512_and_si512(wv, high));                                         \
        }                                                                                                    \
        UNROLL for (int r = 0; r < R; ++r) {                                                                 \
            const float *xr = x + r * ldx + 2 * p;                                                           \
            UNROLL for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(we[b], _mm512_set1_ps(xr[0]), acc[r][b]); \
            UNROLL for (int b = 0; b < B; ++b) acc[r][b] = _mm512_fmadd_ps(wo[b], _mm512_set1_ps(xr[1]), acc[r][b]); \
        }                                                                                                    \
    }                                                                                                        \
    UNROLL for (int r = 0; r < R; ++r)                                                                       \
        UNROLL for (int b = 0; b < B; ++b) _mm512_storeu_ps(tile + r * ldt + b * 16, acc[r][b]);             \
}
#else
/* 16 registers. An accumulator takes a pair's even then its odd product, two dependent FMAs, so a pass needs 8 or
   more accumulators to keep two FMA pipes busy (4 cycles' latency on Zen 4, 5 on Zen 2). One block (2 vectors of 8
   outputs) holds its 4 widened weights and takes up to 5 rows (10 accumulators, x broadcast one at a time); two
   blocks hold each row's 2 broadcasts and widen the 4 weight vectors one by one: 2 rows, 8 accumulators. */
#define ROWS_BUILD 5
#define TWO_ROWS_BUILD 2
#define KERNEL(B, R) KERNEL_HEAD(B, R) {                                                                         \
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);                                                \
    __m256 acc[R][2 * B];                                                                                    \
    UNROLL for (int r = 0; r < R; ++r)                                                                       \
        UNROLL for (int v = 0; v < 2 * B; ++v)                                                               \
            acc[r][v] = p0 ? _mm256_loadu_ps(tile + r * ldt + v * 8) : _mm256_setzero_ps();                  \
    for (long p = p0; p < p1; ++p) {                                                                         \
        if (B == 2) {  /* x held, weights one vector at a time */                                            \
            __m256 xe[R], xo[R];                                                                             \
            UNROLL for (int r = 0; r < R; ++r) {                                                             \
                xe[r] = _mm256_broadcast_ss(x + r * ldx + 2 * p);                                            \
                xo[r] = _mm256_broadcast_ss(x + r * ldx + 2 * p + 1);                                        \
            }                                                                                                \
            UNROLL for (int v = 0; v < 2 * B; ++v) { /* v: the 8 outputs 8 (v % 2) .. of block v / 2 */      \
                if (v % 2 == 0) PREFETCH(R, w + ((v / 2) * P + p + ahead) * 16);                             \
                __m256i wv = _mm256_loadu_si256((const __m256i *)(w + ((v / 2) * P + p) * 16 + 8 * (v % 2))); \
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));                                  \
                __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(wv, high));                                 \
                UNROLL for (int r = 0; r < R; ++r) {                                                         \
                    acc[r][v] = _mm256_fmadd_ps(we, xe[r], acc[r][v]);                                       \
                    acc[r][v] = _mm256_fmadd_ps(wo, xo[r], acc[r][v]);                                       \
                }                                                                                            \
            }                                                                                                \
        } else {  /* weights held, x broadcast one row at a time */                                          \
            __m256 we[2 * B], wo[2 * B];                                                                     \
            PREFETCH(R, w + (p + ahead) * 16);                                                               \
            UNROLL for (int v = 0; v < 2 * B; ++v) {                                                         \
                __m256i wv = _mm256_loadu_si256((const __m256i *)(w + p * 16 + 8 * v));                      \
                we[v] = _mm256_castsi256_ps(_mm256_slli_epi32(wv, 16));                                      \
                wo[v] = _mm256_castsi256_ps(_mm256_and_si256(wv, high));                                     \
            }                                                                                                \
            UNROLL for (int r = 0; r < R; ++r) {                                                             \
                const float *xr = x + r * ldx + 2 * p;                                                       \
                __m256 xe = _mm256_broadcast_ss(xr);                                                         \
                UNROLL for (int v = 0; v < 2 * B; ++v) acc[r][v] = _mm256_fmadd_ps(we[v], xe, acc[r][v]);   \
                __m256 xo = _mm256_broadcast_ss(xr + 1);                                                     \
                UNROLL for (int v = 0; v < 2 * B; ++v) acc[r][v] = _mm256_fmadd_ps(wo[v], xo, acc[r][v]);   \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
    UNROLL for (int r = 0; r < R; ++r)                                                                       \
        UNROLL for (int v = 0; v < 2 * B; ++v) _mm256_storeu_ps(tile + r * ldt + v * 8, acc[r][v]);          \
}
#endif
#ifndef ROWS
#define ROWS ROWS_BUILD
#endif
#ifndef TWO_ROWS
#define TWO_ROWS TWO_ROWS_BUILD
#endif

typedef void (*kernel_fn)(const xin_t *, long, const uint32_t *, long, long, long, float *, long, long);

KERNEL(1, 1) KERNEL(1, 2) KERNEL(1, 3) KERNEL(1, 4) KERNEL(1, 5) KERNEL(2, 1) KERNEL(2, 2)
#if defined(__AVX512F__)  /* ROWS and TWO_ROWS up to 16 and 12 (-D flags: experiments/probes/kernel_ab.py) */
KERNEL(1, 6) KERNEL(1, 7) KERNEL(1, 8) KERNEL(1, 9) KERNEL(1, 10) KERNEL(1, 11) KERNEL(1, 12) KERNEL(1, 13)
KERNEL(1, 14) KERNEL(1, 15) KERNEL(1, 16)
KERNEL(2, 3) KERNEL(2, 4) KERNEL(2, 5) KERNEL(2, 6) KERNEL(2, 7) KERNEL(2, 8) KERNEL(2, 9) KERNEL(2, 10)
KERNEL(2, 11) KERNEL(2, 12)
static const kernel_fn ONE[17] = {0, k1_1, k1_2, k1_3, k1_4, k1_5, k1_6, k1_7, k1_8, k1_9, k1_10, k1_11, k1_12,
                                  k1_13, k1_14, k1_15, k1_16};
static const kernel_fn TWO[13] = {0, k2_1, k2_2, k2_3, k2_4, k2_5, k2_6, k2_7, k2_8, k2_9, k2_10, k2_11, k2_12};
#else  /* ROWS and TWO_ROWS up to 5 and 2 */
static const kernel_fn ONE[6] = {0, k1_1, k1_2, k1_3, k1_4, k1_5};
static const kernel_fn TWO[3] = {0, k2_1, k2_2};
#endif
_Static_assert(ROWS < sizeof ONE / sizeof ONE[0] && TWO_ROWS < sizeof TWO / sizeof TWO[0], "no kernel for ROWS rows");

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

/* the rows of the first pass over M rows: at most ROWS, the passes as even as can be (8 rows in AVX2: 4 + 4, not
   5 + 3); in AVX2 a pass of 2 rows where an even split would make passes of 3 (6 accumulators: their FMAs' latency
   shows; 2 rows take two blocks, 8), so 6 rows go as 2 + 4 and 7 as 2 + 5 */
static inline long pass_rows(long M) {
    long passes = (M + ROWS - 1) / ROWS;
#if !defined(__AVX512F__)
    if (passes > 1 && M / passes == 3) return 2;
#endif
    return M / passes + (M % passes != 0);
}

#ifndef NEXT_GROUP
#define NEXT_GROUP 1  /* 0: off; 1: a group of several passes prefetches the next group of its chunk (passes) */
#endif

#ifndef SLICE
#define SLICE 0  /* 0: off; else the pairs (64-byte lines of a block) each pass takes in turn past one pass of rows */
#endif

/* the pairs p0 .. p1-1 of group g's nb blocks (w: the group's first) for the M rows of x, pass by pass (pass_rows):
   a pass of up to TWO_ROWS rows takes both blocks at once, a longer one each block in turn. tile: M rows, ldt apart;
   each output's accumulator in it, taken up where the pairs before p0 left it */
static void passes(const xin_t *x, long ldx, const uint32_t *w, long P, long p0, long p1, long M, long nb,
                   float *tile, long ldt, int next) {
    for (long m0 = 0, R; m0 < M; m0 += R) {
        R = pass_rows(M - m0);
        /* the last of several passes reads the group from L2 (the first brought it in): it prefetches the next
           group's weights, so that the memory streams while the passes compute, and the next group's first pass
           finds them in L2 */
        long ahead = NEXT_GROUP && next && m0 > 0 && m0 + R >= M ? nb * P : PREFETCH_LINES;
        if (nb == 2 && R <= TWO_ROWS) {
            TWO[R](x + m0 * ldx, ldx, w, P, p0, p1, tile + m0 * ldt, ldt, ahead);
        } else {
            for (long b = 0; b < nb; ++b)
                ONE[R](x + m0 * ldx, ldx, w + b * P * 16, P, p0, p1, tile + m0 * ldt + b * 16, ldt, ahead);
        }
    }
}

/* Each pass takes a group's pairs in one go; with -DSLICE=n, rows that need more than one pass take them n pairs at a
   time, every pass over the slice before the next (its weights in L1 for the later passes), so that the weights
   stream at one pace rather than pausing while a later pass re-reads a group from L2. That gained nothing measurable
   (results/kernel_ab-*.txt, `noslice`) and cost 4% with the weights in cache (packed_tile_rates.py), so it is off.
   Either way a block's weights come from memory once a call, and each output's sum is the same sequence (its pairs
   in order) whatever the pass. */
void packed_matmul(const xin_t *x, long ldx, const uint16_t *packed, long M, long K, long N, void *y, long ldy,
                   int mode, long g0, long g1) {
    long P = K / 2, NB = (N + 15) / 16, slice = M <= ROWS || SLICE <= 0 ? P : SLICE;
    const uint32_t *w = (const uint32_t *)packed;
    float small[ROWS * 32], *tile = M <= ROWS ? small : (float *)__builtin_malloc(M * 32 * sizeof(float));
    for (long g = g0; g < g1; ++g) {  /* two blocks (32 outputs) a group */
        long b0 = 2 * g, nb = NB - b0 < 2 ? NB - b0 : 2;
        for (long p0 = 0; p0 < P; p0 += slice)
            passes(x, ldx, w + b0 * P * 16, P, p0, p0 + slice < P ? p0 + slice : P, M, nb, tile, 32, g + 1 < g1);
        finish(tile, M, 32, 0, b0 * 16, N, y, ldy, mode);
    }
    if (tile != small) __builtin_free(tile);
}

double wait_phase(phase_t *ph, long count) {
#ifdef PHASE_TIMES
    double start = now_ns();
#endif
    for (long spins = 0; __atomic_load_n(&ph->done, __ATOMIC_ACQUIRE) < count; ++spins) {
        if (spins < 2000) _mm_pause(); else sched_yield();
    }
#ifdef PHASE_TIMES
    return now_ns() - start;
#else
    return 0.0;
#endif
}

#define CHUNK 4  /* groups a claim */

/* x (M, K) bf16 as the packed matmul reads it (xin_t): the same words in the AVX512-BF16 build, else widened to fp32
   into a buffer the caller frees (exact: a bf16 is the top half of its fp32) */
static const xin_t *x_in(const uint16_t *x, long M, long K, int threads) {
#if defined(__AVX512BF16__)
    (void)M; (void)K; (void)threads;
    return x;
#else
    float *out = (float *)__builtin_malloc(M * K * sizeof(float));
    #pragma omp parallel for num_threads(threads) schedule(static) if (M * K >= 1 << 16)
    for (long r = 0; r < M; ++r) {
        long k = 0;
        for (; k + 8 <= K; k += 8) _mm256_storeu_ps(out + r * K + k, load8_bf16(x + r * K + k));
        for (; k < K; ++k) out[r * K + k] = bf16_to_float(x[r * K + k]);
    }
    return out;
#endif
}

/* y (M, N) = x (M, K) bf16 . W^T with W packed by pack_bf16, on `threads` OpenMP threads; mode: see packed.h */
void linear_packed(const uint16_t *x, const uint16_t *packed, void *y, long M, long K, long N, int mode, int threads) {
    phase_t phase = {0, 0, {0}};
    long groups = packed_groups(N), chunks = (groups + CHUNK - 1) / CHUNK;
    const xin_t *xin = x_in(x, M, K, threads);
    #pragma omp parallel num_threads(threads)
    RUN_PHASE(&phase, chunks, c, {
        long g1 = (c + 1) * CHUNK < groups ? (c + 1) * CHUNK : groups;
        packed_matmul(xin, K, packed, M, K, N, y, N, mode, c * CHUNK, g1);
    });
    if ((const void *)xin != (const void *)x) __builtin_free((void *)xin);
}
