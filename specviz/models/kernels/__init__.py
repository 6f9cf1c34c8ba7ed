"""A row-invariant bf16 matmul for CPUs without native bf16 (AVX2), compiled at first use.

Why: decode steps stream the weights, and bf16 halves them; but where the CPU has no bf16 instructions
torch emulates bf16 matmuls at about one row's cost per row (the default target's LM head: 5, 8, 11, 16
ms for 1-4 rows, 56 ms for 16), so verifying k tokens costs about k steps and speculation cannot pay. This
kernel streams each weight row once for up to 8 activation rows: it widens bf16 to fp32 in registers
(a 16-bit shift), multiplies-adds with AVX2 FMA in fp32 and rounds the result to bf16. Each output is one
fixed sequence of operations over k, whatever the number of rows, so a row's bits never depend on the
other rows: verification stays bitwise one-token decoding with no padding row.

The same source holds the row-wise attention over a bf16 KV cache that every bf16 CPU forward uses (attend):
one fixed sequence of operations per (row, head), so a row's bits never depend on the other rows either.

The C source below is compiled once with the system C compiler into a per-user cache (about a second) and
called through ctypes: for AVX2/FMA, and also for AVX-512 where the CPU has it, whose attention takes 16-lane
registers and gives the AVX2 build's bits (one tree of 16 rows over 800 keys, 30 layers: 21.7 against 15.4 ms
on 2 cores, assets/bench/attend_ab_avx512.txt). Where there is no compiler, or the CPU lacks AVX2/FMA, `available()` is
False and the stock torch kernels run (a Space's image without gcc, say); nothing else changes.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>

static inline __m256 load_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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

/* exp of each lane (x <= 0 here: scores minus their max), Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r,
   times 2^n; within 2 ulp of expf, and the same bits for the same input whatever the other lanes or the width.
   EXP(name, vector type, its integer type, intrinsics prefix, round to nearest, integer bits as floats). */
#define EXP(NAME, V, VI, P, ROUND, AS_PS) static inline V NAME(V x) {                                 \
    x = P##_max_ps(x, P##_set1_ps(-87.0f));  /* exp(-87) ~ 1.6e-38: nothing next to the max's 1 */     \
    V n = ROUND(P##_mul_ps(x, P##_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); \
    V r = P##_fnmadd_ps(n, P##_set1_ps(0.693359375f), x);                                              \
    r = P##_fnmadd_ps(n, P##_set1_ps(-2.12194440e-4f), r);                                             \
    V y = P##_set1_ps(1.9875691500e-4f);                                                               \
    y = P##_fmadd_ps(y, r, P##_set1_ps(1.3981999507e-3f));                                             \
    y = P##_fmadd_ps(y, r, P##_set1_ps(8.3334519073e-3f));                                             \
    y = P##_fmadd_ps(y, r, P##_set1_ps(4.1665795894e-2f));                                             \
    y = P##_fmadd_ps(y, r, P##_set1_ps(1.6666665459e-1f));                                             \
    y = P##_fmadd_ps(y, r, P##_set1_ps(5.0000001201e-1f));                                             \
    y = P##_fmadd_ps(P##_mul_ps(y, r), r, P##_add_ps(r, P##_set1_ps(1.0f)));                           \
    VI e = P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23);                 \
    return P##_mul_ps(y, AS_PS(e));                                                                    \
}
EXP(exp8, __m256, __m256i, _mm256, _mm256_round_ps, _mm256_castsi256_ps)

/* the 4 sums of a[0..3]'s lanes (lane i: a[i]'s sum), each ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)) */
static inline __m128 sums4(const __m256 *a) {
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

/* a block of 16 query values split into its 8 even and its 8 odd ones (the layout cache rows are read in) */
static inline void split16(const float *q, float *even, float *odd) {
    for (int i = 0; i < 8; ++i) { even[i] = q[2 * i]; odd[i] = q[2 * i + 1]; }
}

/* the largest of v's 4 lanes, taken in lane order */
static inline float max4(__m128 v) {
    float lanes[4], m;
    _mm_storeu_ps(lanes, v);
    m = lanes[0];
    for (int i = 1; i < 4; ++i) if (lanes[i] > m) m = lanes[i];
    return m;
}

/* G query heads (G <= 3, a compile-time constant once inlined) that read one key/value head, for one row: q (G, D)
   fp32, kh / vh that head's keys and values, ix the row's n visible positions, s G score buffers of `room` floats,
   out (G, D). A cache row is read 16 values at a time as 8 words: a shift gives its even values in fp32, a mask its
   odd ones (no widening shuffles), and each read serves all G heads; the query is split the same way, and the output
   joined back. Scores go 4 keys at a time (a last short block repeats its last key and drops the extra lanes), the
   exponentials 8 at a time (exp8), the values one key at a time over two blocks of 16 values. What a head computes
   does not depend on G or on the other rows: one fixed sequence of operations per (row, head). */
static inline __attribute__((always_inline)) void attend_heads(const int G, const float *q, const uint16_t *kh,
        const uint16_t *vh, const int32_t *ix, long n, long D, float scale, float *s, long room, float *out) {
    const __m256 high = _mm256_castsi256_ps(_mm256_set1_epi32((int)0xffff0000u));
    long nb = D / 16;
    __m256 qe[3][16], qo[3][16];
    for (int hh = 0; hh < G; ++hh)
        for (long b = 0; b < nb; ++b) {
            float e[8], o[8];
            split16(q + hh * D + 16 * b, e, o);
            qe[hh][b] = _mm256_loadu_ps(e);
            qo[hh][b] = _mm256_loadu_ps(o);
        }
    __m128 mx[3];
    for (int hh = 0; hh < G; ++hh) mx[hh] = _mm_set1_ps(-__builtin_inff());
    for (long j0 = 0; j0 < n; j0 += 4) {
        const uint16_t *kr[4];
        for (int i = 0; i < 4; ++i) kr[i] = kh + (long)ix[j0 + i < n ? j0 + i : n - 1] * D;
        __m256 a[3][4];
        for (int hh = 0; hh < G; ++hh)
            for (int i = 0; i < 4; ++i) a[hh][i] = _mm256_setzero_ps();
        for (long b = 0; b < nb; ++b)
            for (int i = 0; i < 4; ++i) {
                __m256 w = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(kr[i] + 16 * b)));
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(w), 16)), wo = _mm256_and_ps(w, high);
                for (int hh = 0; hh < G; ++hh) {
                    a[hh][i] = _mm256_fmadd_ps(we, qe[hh][b], a[hh][i]);
                    a[hh][i] = _mm256_fmadd_ps(wo, qo[hh][b], a[hh][i]);
                }
            }
        for (int hh = 0; hh < G; ++hh) {
            __m128 sc = _mm_mul_ps(sums4(a[hh]), _mm_set1_ps(scale));
            _mm_storeu_ps(s + hh * room + j0, sc);  /* lanes past n are copies of the last key's score */
            mx[hh] = _mm_max_ps(mx[hh], sc);
        }
    }
    float sum[3];
    for (int hh = 0; hh < G; ++hh) {
        float m = max4(mx[hh]), *sh = s + hh * room;
        __m256 total = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
        for (long j0 = 0; j0 < n; j0 += 8) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sh + j0), mv));
            if (n - j0 < 8) {  /* zero the lanes past n */
                __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j0)), lane)));
            }
            _mm256_storeu_ps(sh + j0, e);
            total = _mm256_add_ps(total, e);
        }
        sum[hh] = hsum(total);
    }
    for (long b0 = 0; b0 < nb; b0 += 2) {
        int two = nb - b0 >= 2;
        __m256 ae[3][2], ao[3][2];
        for (int hh = 0; hh < G; ++hh) ae[hh][0] = ae[hh][1] = ao[hh][0] = ao[hh][1] = _mm256_setzero_ps();
        for (long j = 0; j < n; ++j) {
            const uint16_t *vr = vh + (long)ix[j] * D + 16 * b0;
            for (int bb = 0; bb < 2; ++bb) {
                if (bb && !two) break;
                __m256 w = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(vr + 16 * bb)));
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(w), 16)), wo = _mm256_and_ps(w, high);
                for (int hh = 0; hh < G; ++hh) {
                    __m256 p = _mm256_broadcast_ss(s + hh * room + j);
                    ae[hh][bb] = _mm256_fmadd_ps(p, we, ae[hh][bb]);
                    ao[hh][bb] = _mm256_fmadd_ps(p, wo, ao[hh][bb]);
                }
            }
        }
        for (int hh = 0; hh < G; ++hh) {
            __m256 inv = _mm256_set1_ps(1.f / sum[hh]);
            for (int bb = 0; bb < 1 + two; ++bb) {
                float e[8], d[8], *o = out + hh * D + 16 * (b0 + bb);
                _mm256_storeu_ps(e, _mm256_mul_ps(ae[hh][bb], inv));
                _mm256_storeu_ps(d, _mm256_mul_ps(ao[hh][bb], inv));
                for (int i = 0; i < 8; ++i) { o[2 * i] = e[i]; o[2 * i + 1] = d[i]; }
            }
        }
    }
}

#ifdef __AVX512F__
/* attend_heads with 16-lane registers where the CPU has AVX-512, bit-identical to it: each lane runs the same
   sequence of operations as the same 8-lane lane there. Scores take two keys per register (the low half one
   key's block, the high half the next key's), the exponentials 16 at a time (summed one half after the other),
   the values two blocks per register (4 blocks per pass over the keys). */
static inline __m512 pair512(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

static inline __m256 high256(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

EXP(exp16, __m512, __m512i, _mm512, _mm512_roundscale_ps, _mm512_castsi512_ps)

static inline __attribute__((always_inline)) void attend_heads512(const int G, const float *q, const uint16_t *kh,
        const uint16_t *vh, const int32_t *ix, long n, long D, float scale, float *s, long room, float *out) {
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    long nb = D / 16;
    __m512 qe[3][16], qo[3][16];  /* block b's even / odd query values, in both halves */
    for (int hh = 0; hh < G; ++hh)
        for (long b = 0; b < nb; ++b) {
            float e[8], o[8];
            split16(q + hh * D + 16 * b, e, o);
            qe[hh][b] = pair512(_mm256_loadu_ps(e), _mm256_loadu_ps(e));
            qo[hh][b] = pair512(_mm256_loadu_ps(o), _mm256_loadu_ps(o));
        }
    __m128 mx[3];
    for (int hh = 0; hh < G; ++hh) mx[hh] = _mm_set1_ps(-__builtin_inff());
    for (long j0 = 0; j0 < n; j0 += 4) {
        const uint16_t *kr[4];
        for (int i = 0; i < 4; ++i) kr[i] = kh + (long)ix[j0 + i < n ? j0 + i : n - 1] * D;
        __m512 a[3][2];
        for (int hh = 0; hh < G; ++hh) a[hh][0] = a[hh][1] = _mm512_setzero_ps();
        for (long b = 0; b < nb; ++b)
            for (int p = 0; p < 2; ++p) {
                __m512i w = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(kr[2 * p] + 16 * b))),
                    _mm256_loadu_si256((const __m256i *)(kr[2 * p + 1] + 16 * b)), 1);
                __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
                __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(w, high));
                for (int hh = 0; hh < G; ++hh) {
                    a[hh][p] = _mm512_fmadd_ps(we, qe[hh][b], a[hh][p]);
                    a[hh][p] = _mm512_fmadd_ps(wo, qo[hh][b], a[hh][p]);
                }
            }
        for (int hh = 0; hh < G; ++hh) {
            __m256 four[4] = {_mm512_castps512_ps256(a[hh][0]), high256(a[hh][0]),
                              _mm512_castps512_ps256(a[hh][1]), high256(a[hh][1])};
            __m128 sc = _mm_mul_ps(sums4(four), _mm_set1_ps(scale));
            _mm_storeu_ps(s + hh * room + j0, sc);
            mx[hh] = _mm_max_ps(mx[hh], sc);
        }
    }
    float sum[3];
    for (int hh = 0; hh < G; ++hh) {
        float m = max4(mx[hh]), *sh = s + hh * room;
        __m256 total = _mm256_setzero_ps();
        __m512 mv = _mm512_set1_ps(m);
        for (long j0 = 0; j0 < n; j0 += 16) {
            __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sh + j0), mv));
            if (n - j0 < 16)  /* zero the lanes past n */
                e = _mm512_maskz_mov_ps((__mmask16)((1u << (n - j0)) - 1u), e);
            _mm512_storeu_ps(sh + j0, e);
            total = _mm256_add_ps(total, _mm512_castps512_ps256(e));
            if (n - j0 > 8) total = _mm256_add_ps(total, high256(e));
        }
        sum[hh] = hsum(total);
    }
    for (long b0 = 0; b0 < nb; b0 += 4) {
        long left = nb - b0 < 4 ? nb - b0 : 4;  /* blocks this pass: 1 to 4, two per register */
        __mmask16 m0 = left >= 2 ? 0xffff : 0x00ff, m1 = left >= 4 ? 0xffff : (left == 3 ? 0x00ff : 0);
        __m512 ae[3][2], ao[3][2];
        for (int hh = 0; hh < G; ++hh) ae[hh][0] = ae[hh][1] = ao[hh][0] = ao[hh][1] = _mm512_setzero_ps();
        for (long j = 0; j < n; ++j) {
            const uint16_t *vr = vh + (long)ix[j] * D + 16 * b0;
            for (int pp = 0; pp < 2; ++pp) {
                __mmask16 mk = pp ? m1 : m0;
                if (!mk) break;
                __m512i w = _mm512_maskz_loadu_epi32(mk, vr + 32 * pp);
                __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
                __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(w, high));
                for (int hh = 0; hh < G; ++hh) {
                    __m512 p = _mm512_set1_ps(s[hh * room + j]);
                    ae[hh][pp] = _mm512_fmadd_ps(p, we, ae[hh][pp]);
                    ao[hh][pp] = _mm512_fmadd_ps(p, wo, ao[hh][pp]);
                }
            }
        }
        for (int hh = 0; hh < G; ++hh) {
            __m512 inv = _mm512_set1_ps(1.f / sum[hh]);
            for (int pp = 0; pp < 2; ++pp) {
                float e[16], d[16];
                long blocks = left - 2 * pp < 2 ? left - 2 * pp : 2;
                if (blocks <= 0) break;
                _mm512_storeu_ps(e, _mm512_mul_ps(ae[hh][pp], inv));
                _mm512_storeu_ps(d, _mm512_mul_ps(ao[hh][pp], inv));
                float *o = out + hh * D + 16 * (b0 + 2 * pp);
                for (int i = 0; i < 8 * blocks; ++i) { o[2 * i] = e[i]; o[2 * i + 1] = d[i]; }
            }
        }
    }
}
#define ATTEND_HEADS attend_heads512
#else
#define ATTEND_HEADS attend_heads
#endif

/* Row-wise attention over a bf16 KV cache. q (R, H, D) fp32 query rows; k, v: one sequence's cache, key/value
   head j at k + j*hs, position p at + p*D. Row r sees the cache positions idx[off[r] .. off[r+1]), in order.
   Query head h reads key/value head h / (H / KVH). out (R, H, D) fp32 = softmax(q . K^T * scale) . V.
   One task per (row, key/value head): its query heads go three at a time through attend_heads, so each cache
   read serves them all. Each (row, head) is one fixed sequence of operations, which depends only on its query
   and its visible keys, so its bits never depend on R. D % 16 == 0, D <= 256. */
void attend_bf16(const float *q, const uint16_t *k, const uint16_t *v, float *out, const int32_t *idx,
                 const int64_t *off, long R, long H, long KVH, long D, long hs, float scale, int threads) {
    long g = H / KVH, maxn = 1;
    for (long r = 0; r < R; ++r) if (off[r + 1] - off[r] > maxn) maxn = off[r + 1] - off[r];
    long room = maxn + 16;  /* score stores run up to 15 past n */
    #pragma omp parallel num_threads(threads)
    {
        float *s = (float *)__builtin_malloc(3 * room * sizeof(float));
        #pragma omp for schedule(static)
        for (long t = 0; t < R * KVH; ++t) {
            long r = t / KVH, j = t % KVH, n = off[r + 1] - off[r];
            const uint16_t *kh = k + j * hs, *vh = v + j * hs;
            const int32_t *ix = idx + off[r];
            for (long h = j * g; h < (j + 1) * g; h += 3) {
                const float *qh = q + (r * H + h) * D;
                float *oh = out + (r * H + h) * D;
                switch ((j + 1) * g - h < 3 ? (j + 1) * g - h : 3) {
                    case 1: ATTEND_HEADS(1, qh, kh, vh, ix, n, D, scale, s, room, oh); break;
                    case 2: ATTEND_HEADS(2, qh, kh, vh, ix, n, D, scale, s, room, oh); break;
                    default: ATTEND_HEADS(3, qh, kh, vh, ix, n, D, scale, s, room, oh); break;
                }
            }
        }
        __builtin_free(s);
    }
}
"""

_lib = None
_tried = False
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def cpuinfo(*keys: str) -> str:
    """The value of the first /proc/cpuinfo line starting with one of `keys`; empty where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((l for l in text.splitlines() if l.startswith(keys)), "").partition(":")[2].strip()


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (x86 "flags", Arm "Features"); empty where unreadable."""
    return frozenset(cpuinfo("flags", "Features").split())


# the instruction sets SOURCE is compiled for: the compiler flags and the CPU flags each needs. The attention
# kernel takes 16-lane registers under AVX-512 (bit-identical to its 8-lane AVX2 form); the matmul is the same code.
ISAS = {"avx2": (("-mavx2", "-mfma"), {"avx2", "fma"}),
        "avx512": (("-mavx2", "-mfma", "-mavx512f"), {"avx2", "fma", "avx512f"})}


def best_isa() -> str | None:
    """The widest instruction set in ISAS this CPU has (SPECVIZ_KERNEL_ISA=avx2 keeps the AVX2 build); None where
    it lacks AVX2/FMA."""
    fit = [isa for isa, (_, needs) in ISAS.items() if needs <= cpu_flags()]
    asked = os.environ.get("SPECVIZ_KERNEL_ISA")
    return asked if asked in fit else (fit[-1] if fit else None)


@functools.lru_cache(maxsize=None)
def library(isa: str) -> ctypes.CDLL | None:
    """SOURCE compiled for `isa` once per source version into ~/.cache/specviz (or a temp folder) and loaded; None
    where this CPU lacks the instruction set or there is no compiler."""
    flags, needs = ISAS[isa]
    if not needs <= cpu_flags():
        return None
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    folder = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specviz"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / "specviz-kernels"
        folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"kernels-{isa}-{digest}.so"
    if not lib.exists():
        src = folder / f"kernels-{digest}.c"
        src.write_text(SOURCE)
        tmp = folder / f"kernels-{isa}-{digest}.{os.getpid()}.so"
        cc = os.environ.get("CC", "cc")
        try:
            subprocess.run([cc, "-O3", *flags, "-fopenmp", "-fPIC", "-shared", str(src), "-o", str(tmp), "-lm"],
                           check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
        tmp.replace(lib)  # atomic: concurrent builders never load a half-written file
    try:
        handle = ctypes.CDLL(str(lib))
    except OSError:
        return None
    handle.linear_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                                   ctypes.c_long, ctypes.c_int]
    handle.linear_bf16.restype = None
    handle.attend_bf16.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_long] * 5 + [ctypes.c_float, ctypes.c_int]
    handle.attend_bf16.restype = None
    return handle


def available() -> bool:
    """Whether the kernel is compiled and loadable here (compiled on the first call)."""
    global _lib, _tried
    with _lock:
        if not _tried:
            _tried = True
            if os.environ.get("SPECVIZ_NO_KERNELS") != "1":
                isa = best_isa()
                _lib = library(isa) if isa else None
        return _lib is not None


def threads() -> int:
    """The kernels' OpenMP threads: SPECVIZ_KERNEL_THREADS, else torch's. Their threads spin briefly at each
    call's end, so where another busy process shares the cores, one thread measures faster (2 cores: 23 ms
    for the target's linears alone, 58-185 ms with a busy neighbour, 29 ms with one thread)."""
    value = os.environ.get("SPECVIZ_KERNEL_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else torch.get_num_threads()


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (..., K) bf16 · weight (N, K) bf16 ^T -> (..., N) bf16, each row computed on its own in fp32 and
    rounded once (the same rounding as torch's .to(bfloat16)). `weight` must be contiguous."""
    if x.dtype != torch.bfloat16 or not x.is_contiguous():
        x = x.to(torch.bfloat16).contiguous()
    n, k = weight.shape
    out = x.new_empty(x.shape[:-1] + (n,))
    _lib.linear_bf16(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // k, k, n, threads())
    return out


ATTEND_PARALLEL = 1 << 13  # (visible keys summed over rows) x heads from which attention uses every thread


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, index: torch.Tensor, offsets: torch.Tensor,
           scale: float, isa: str | None = None) -> torch.Tensor:
    """query (q, h, d) fp32; key, value (h_kv, kv, d) bf16 with rows of d contiguous; row i attends over the
    cache positions index[offsets[i]:offsets[i + 1]] (int32, int64). Returns (q, h, d) fp32. `isa` picks a build
    (ISAS; tests and benches compare them), else the one `available()` loaded."""
    q_len, h, d = query.shape
    if key.stride(-1) != 1 or key.stride(-2) != d or value.stride() != key.stride():
        key, value = key.contiguous(), value.contiguous()
    query = query.contiguous()
    out = torch.empty_like(query)
    # a step's rows are microseconds of work: one thread, no fork/join (threads never change the bits)
    count = threads() if index.numel() * h >= ATTEND_PARALLEL else 1
    lib = library(isa) if isa else _lib
    lib.attend_bf16(query.data_ptr(), key.data_ptr(), value.data_ptr(), out.data_ptr(), index.data_ptr(),
                    offsets.data_ptr(), q_len, h, key.shape[0], d, key.stride(0), scale, count)
    return out


def can_attend(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether `attend` takes this call: one sequence, a bf16 cache on CPU, head size a multiple of 16 (≤ 256)."""
    return (query.device.type == "cpu" and query.shape[0] == 1 and key.dtype == torch.bfloat16
            and query.shape[-1] % 16 == 0 and query.shape[-1] <= 256 and available())


class RowLinear(torch.nn.Module):
    """An nn.Linear (bf16, CPU) computed by `linear`, its bias (if any) added to the rounded product; shares the
    original weight and bias tensors."""

    def __init__(self, linear_module: torch.nn.Linear):
        super().__init__()
        self.weight = linear_module.weight  # contiguous: a freshly loaded (N, K) parameter
        if not self.weight.is_contiguous():
            self.weight.data = self.weight.data.contiguous()
        self.bias = linear_module.bias
        self.in_features, self.out_features = linear_module.in_features, linear_module.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = linear(x, self.weight)
        return out if self.bias is None else out + self.bias

    def to_linear(self) -> torch.nn.Linear:
        out = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                              device=self.weight.device, dtype=self.weight.dtype)
        out.weight = self.weight
        if self.bias is not None:
            out.bias = self.bias
        return out


def swap_in(model: torch.nn.Module, bias: bool = False) -> int:
    """Replace every bf16 nn.Linear of `model` (the LM head included) by a RowLinear: the bias-free ones, and with
    `bias` (a drafter's module) those with a bias too; returns how many."""
    count = 0
    for name, child in model.named_children():
        if (isinstance(child, torch.nn.Linear) and (bias or child.bias is None)
                and child.weight.dtype == torch.bfloat16):
            setattr(model, name, RowLinear(child))
            count += 1
        else:
            count += swap_in(child, bias)
    return count


def swap_out(model: torch.nn.Module) -> None:
    """Back to nn.Linear (the int8 copy quantizes nn.Linear modules)."""
    for name, child in model.named_children():
        if isinstance(child, RowLinear):
            setattr(model, name, child.to_linear())
        else:
            swap_out(child)
