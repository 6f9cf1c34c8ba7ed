/* A register-only multiply-add throughput probe for experiments/probes/host_bound.py: independent accumulator chains
   (more than latency x pipes, so latency is hidden), no loads or stores in the loop, on `threads` OpenMP threads.
   Compiled with a kernels build's flags (kernels.ISAS); mac_rate returns multiply-adds a second, all threads together:
   with cpu_clock, each thread's rate over its own CPU time, summed (on a shared host: the rate of the cores while
   they run this, not the time other work held them). kind 0: 256-bit fp32 FMA (vfmadd231ps ymm, 8 each; the AVX2 build's matmul), kind 1: 512-bit fp32 FMA (16 each;
   the AVX-512F build's), kind 2: vdpbf16ps zmm (32 each; the AVX512-BF16 build's). -1 where the build lacks it. */
#include <immintrin.h>
#include <omp.h>
#include <time.h>

#define CHAINS 12

static float ymm_chains(long iters) {
    __m256 acc[CHAINS], a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_set1_ps((float)c);
    for (long i = 0; i < iters; ++i) {
        _Pragma("GCC unroll 32") for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
        __asm__ volatile("" : "+x"(a));  /* keeps the loop: a is opaque to the compiler */
    }
    __m256 s = acc[0];
    for (int c = 1; c < CHAINS; ++c) s = _mm256_add_ps(s, acc[c]);
    return _mm256_cvtss_f32(s);
}

#if defined(__AVX512F__)
#define ZCHAINS 24
static float zmm_chains(long iters) {
    __m512 acc[ZCHAINS], a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
    for (int c = 0; c < ZCHAINS; ++c) acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < iters; ++i) {
        _Pragma("GCC unroll 32") for (int c = 0; c < ZCHAINS; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
        __asm__ volatile("" : "+v"(a));
    }
    __m512 s = acc[0];
    for (int c = 1; c < ZCHAINS; ++c) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}
#endif

#if defined(__AVX512BF16__)
static float bf16_chains(long iters) {
    __m512 acc[ZCHAINS];
    __m512i a = _mm512_set1_epi32(0x3f803f80), b = _mm512_set1_epi32(0x3a833a83);  /* bf16 pairs (1.0, 1e-3) */
    for (int c = 0; c < ZCHAINS; ++c) acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < iters; ++i) {
        _Pragma("GCC unroll 32") for (int c = 0; c < ZCHAINS; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], (__m512bh)a, (__m512bh)b);
        __asm__ volatile("" : "+v"(a));
    }
    __m512 s = acc[0];
    for (int c = 1; c < ZCHAINS; ++c) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}
#endif

volatile float fma_peak_sink;

static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double mac_rate(int kind, long iters, int threads, int cpu_clock) {
    long per_op = kind == 0 ? 8 * CHAINS : kind == 1 ? 16 * 24 : 32 * 24;
#if !defined(__AVX512F__)
    if (kind != 0) return -1;
#endif
#if !defined(__AVX512BF16__)
    if (kind == 2) return -1;
#endif
    double start = omp_get_wtime(), summed = 0;
    #pragma omp parallel num_threads(threads) reduction(+ : summed)
    {
        double own = thread_seconds();
        float s = 0;
        if (kind == 0) s = ymm_chains(iters);
#if defined(__AVX512F__)
        else if (kind == 1) s = zmm_chains(iters);
#endif
#if defined(__AVX512BF16__)
        else s = bf16_chains(iters);
#endif
        fma_peak_sink = s;
        summed += (double)per_op * iters / (thread_seconds() - own);
    }
    return cpu_clock ? summed : (double)per_op * iters * threads / (omp_get_wtime() - start);
}
