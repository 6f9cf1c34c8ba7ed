/* A row-invariant bf16 matmul (linear_bf16): each weight row streamed once for up to 8 activation rows, widened
   to fp32 in registers, multiplied-added with AVX2 FMA in fp32 and rounded once to bf16. */
#include "common.h"

static inline __m256 load_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/* fp32 -> bf16, round to nearest even (torch's rounding), NaN -> 0x7fc0 */
static inline uint16_t to_bf16(float f) {
    uint32_t b;
    __builtin_memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

#define PF 4

/* pass R: output columns n0 .. n1-1 for R activation rows. y[r][n] = sum over k of w[n][k] * x[r][k]: one
   fp32 accumulator over k in blocks of 8, then its scalar tail, whatever R, so a row's bits never depend
   on the other rows. Each weight row is prefetched PF rows ahead (measured: a fifth off a one-row step). */
#define PASS(R) static void pass##R(const float *x, const uint16_t *w, uint16_t *y, long K, long N, long n0, long n1) { \
    for (long n = n0; n < n1; ++n) {                                                   \
        const uint16_t *wr = w + n * K;                                                \
        for (long b = 0; b < K * 2; b += 64)                                           \
            _mm_prefetch((const char *)(wr + PF * K) + b, _MM_HINT_T0);                \
        __m256 acc[R];                                                                 \
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();                      \
        long k = 0;                                                                    \
        for (; k + 8 <= K; k += 8) {                                                   \
            __m256 wv = load_bf16(wr + k);                                             \
            for (int r = 0; r < R; ++r)                                                \
                acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * K + k), acc[r]);  \
        }                                                                              \
        for (int r = 0; r < R; ++r) {                                                  \
            float s = hsum(acc[r]);                                                    \
            for (long j = k; j < K; ++j) {                                             \
                uint32_t bits = ((uint32_t)wr[j]) << 16; float wf;                      \
                __builtin_memcpy(&wf, &bits, 4);                                       \
                s = __builtin_fmaf(wf, x[r * K + j], s);                               \
            }                                                                          \
            y[r * N + n] = to_bf16(s);                                                 \
        }                                                                              \
    }                                                                                  \
}
PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6) PASS(7) PASS(8)

/* y (M, N) bf16 = x (M, K) bf16 . w (N, K) bf16 ^T, accumulated in fp32, output columns split over `threads`
   OpenMP threads. Columns go in blocks of 16 weight rows; each block serves every pass of up to 8
   activation rows while it is in cache, so more than 8 rows still stream the weights from memory once. */
void linear_bf16(const uint16_t *xb, const uint16_t *w, uint16_t *y, long M, long K, long N, int threads) {
    float *x = (float *)__builtin_malloc(M * K * sizeof(float));
    for (long i = 0; i < M * K; ++i) {
        uint32_t bits = ((uint32_t)xb[i]) << 16;
        __builtin_memcpy(x + i, &bits, 4);
    }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long t = 0; t < threads; ++t) {
        long n0 = N * t / threads, n1 = N * (t + 1) / threads;
        for (long b0 = n0; b0 < n1; b0 += 16) {
            long b1 = b0 + 16 < n1 ? b0 + 16 : n1;
            for (long m0 = 0; m0 < M; m0 += 8) {
                const float *xs = x + m0 * K;
                uint16_t *ys = y + m0 * N;
                switch (M - m0 < 8 ? M - m0 : 8) {
                    case 1: pass1(xs, w, ys, K, N, b0, b1); break;
                    case 2: pass2(xs, w, ys, K, N, b0, b1); break;
                    case 3: pass3(xs, w, ys, K, N, b0, b1); break;
                    case 4: pass4(xs, w, ys, K, N, b0, b1); break;
                    case 5: pass5(xs, w, ys, K, N, b0, b1); break;
                    case 6: pass6(xs, w, ys, K, N, b0, b1); break;
                    case 7: pass7(xs, w, ys, K, N, b0, b1); break;
                    default: pass8(xs, w, ys, K, N, b0, b1); break;
                }
            }
        }
    }
    __builtin_free(x);
}
