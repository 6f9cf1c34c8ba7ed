/* attend.c alone, in C: 30 layers' attention of R rows (9 heads over 3 key/value heads, head size 64) over 256 cached
   keys plus each row's share of R new ones (row r: the 256, then every key of the new ones up to r, every other one
   past row 4, as a tree's ancestors thin out), bf16-valued queries as the fused decoder passes them (FP32Q=1: fp32
   ones); best of 30 repetitions of the 30 calls, one thread. Build it against a copy of attend.c, e.g. with P·V
   left out (-DSKIP_PV where the copy wraps its P·V loop in #ifndef SKIP_PV) to split scores from P·V:

     F="-O3 -mavx2 -mfma -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -fopenmp"
     gcc $F -Ispecviz/models/kernels specviz/models/kernels/attend.c experiments/probes/attend_bench.c -o /tmp/ab -lm
     /tmp/ab 32                                                                                                      */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void attend_bf16(const float *q, const uint16_t *k, const uint16_t *v, float *out, const int32_t *idx,
                 const int64_t *off, long R, long H, long KVH, long D, long hs, float scale, int threads);

int main(int argc, char **argv) {
    long R = argc > 1 ? atol(argv[1]) : 32, H = 9, KVH = 3, D = 64, P = 256, L = P + R;
    float *q = malloc(R * H * D * 4), *out = malloc(R * H * D * 4);
    uint16_t *k = malloc(KVH * L * D * 2), *v = malloc(KVH * L * D * 2);
    for (long i = 0; i < R * H * D; ++i) {
        float f = rand() / (float)RAND_MAX - 0.5f;
        uint32_t u;
        memcpy(&u, &f, 4);
        if (getenv("FP32Q") == NULL) u &= 0xffff0000u;
        memcpy(&q[i], &u, 4);
    }
    for (long i = 0; i < KVH * L * D; ++i) {
        k[i] = (uint16_t)(0x3f00 + (rand() & 0xff));
        v[i] = (uint16_t)((0x3f00 + (rand() & 0xff)) ^ ((rand() & 1) << 15));
    }
    int32_t *idx = malloc(R * L * 4);
    int64_t *off = malloc((R + 1) * 8), n = 0;
    off[0] = 0;
    for (long r = 0; r < R; ++r) {
        for (long j = 0; j < P; ++j) idx[n++] = (int32_t)j;
        for (long j = 0; j <= r; j += 1 + (r > 4)) idx[n++] = (int32_t)(P + j);
        off[r + 1] = n;
    }
    double best = 1e9;
    for (int rep = 0; rep < 30; ++rep) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int l = 0; l < 30; ++l) attend_bf16(q, k, v, out, idx, off, R, H, KVH, D, L * D, 0.125f, 1);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double t = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
        if (t < best) best = t;
    }
    printf("R=%ld, 30 layers: %.3f ms\n", R, best);
    return 0;
}
