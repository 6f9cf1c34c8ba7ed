/* Row-wise attention over a bf16 KV cache (attend_bf16): one fixed sequence of operations per (row, head), in
   8-lane registers, or 16-lane ones where the build has AVX-512 (the same bits). Under AVX512-BF16 the rows of one
   llama.c call take the scores of the keys they all see (a tree's context) from key tiles, a key a lane, laid out
   once for all rows: the same operations per key, so the same bits, without a sum across lanes. */
#include "common.h"

#define UNROLL_ALL _Pragma("GCC unroll 4")  /* loops over heads and registers: their accumulators stay in registers */
#ifndef TILE_ROWS
#define TILE_ROWS 2  /* key tiles from this many rows a call (a -D flag: experiments/probes/kernel_ab.py) */
#endif

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
                for (int hh = 0; hh < G; ++hh) {  /* a pair's odd product, then its even one (as vdpbf16ps) */
                    a[hh][i] = _mm256_fmadd_ps(wo, qo[hh][b], a[hh][i]);
                    a[hh][i] = _mm256_fmadd_ps(we, qe[hh][b], a[hh][i]);
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
        UNROLL_ALL for (int hh = 0; hh < G; ++hh) ae[hh][0] = ae[hh][1] = ao[hh][0] = ao[hh][1] = _mm256_setzero_ps();
        for (long j = 0; j < n; ++j) {  /* both blocks every key (a last odd block reads its own values twice and
                                             keeps one): the loops unroll, and the accumulators stay in registers */
            const uint16_t *vr = vh + (long)ix[j] * D + 16 * b0;
            UNROLL_ALL for (int bb = 0; bb < 2; ++bb) {
                __m256 w = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(vr + 16 * bb * two)));
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(w), 16)), wo = _mm256_and_ps(w, high);
                UNROLL_ALL for (int hh = 0; hh < G; ++hh) {
                    __m256 p = _mm256_broadcast_ss(s + hh * room + j);
                    ae[hh][bb] = _mm256_fmadd_ps(p, we, ae[hh][bb]);
                    ao[hh][bb] = _mm256_fmadd_ps(p, wo, ao[hh][bb]);
                }
                __asm__ volatile("" ::: "memory");  /* each block broadcasts p again: 12 accumulators + 3 in 16 */
            }
        }
        UNROLL_ALL for (int hh = 0; hh < G; ++hh) {
            __m256 inv = _mm256_set1_ps(1.f / sum[hh]);
            UNROLL_ALL for (int bb = 0; bb < 2; ++bb) {
                if (bb && !two) continue;
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

#if defined(__AVX512BF16__)
/* Key tiles: a key a lane, for the rows of one call that share their first keys (a tree's context, a chain's
   prefix). key_tiles writes keys ix[16 g .. 16 g + 15] of one key/value head (kh: D bf16 a key) as tile g: D / 2
   registers of 16 words, register p holding word p (values 2p and 2p + 1) of the 16 keys; D % 32 == 0. */
void key_tiles(const uint16_t *kh, const int32_t *ix, long g, long D, uint32_t *tiles) {
    uint32_t *tile = tiles + g * 8 * D;
    for (long half = 0; half < D / 32; ++half) {  /* a 16 x 16 transpose of words 16 half .. 16 half + 15 */
        __m512i r[16], t[16], u[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(kh + (long)ix[16 * g + i] * D + 32 * half);
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4) {  /* u[i + c]: rows i .. i + 3, words c, c + 4, c + 8, c + 12 a 128-bit lane */
            u[i + 0] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
            u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
            u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
            u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
        }
        for (int c = 0; c < 4; ++c) {
            __m512i a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
            __m512i e = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), f = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
            uint32_t *w = tile + 16 * (16 * half + c);
            _mm512_storeu_si512(w + 16 * 0, _mm512_shuffle_i32x4(a, e, 0x88));  /* word c */
            _mm512_storeu_si512(w + 16 * 4, _mm512_shuffle_i32x4(b, f, 0x88));  /* word c + 4 */
            _mm512_storeu_si512(w + 16 * 8, _mm512_shuffle_i32x4(a, e, 0xdd));  /* word c + 8 */
            _mm512_storeu_si512(w + 16 * 12, _mm512_shuffle_i32x4(b, f, 0xdd)); /* word c + 12 */
        }
    }
}

/* The scores of keys 0 .. shared - 1 (shared % 16 == 0) from their tiles, for G heads whose query values are all
   bf16: s[hh * room + j], and their max into mx. A lane is a key, so no sums across lanes; each key gets the
   operations the row-wise loop below gives it: partial l (l < 8) adds pair l of block b (values 16 b + 2 l, + 1) by
   vdpbf16ps for b = 0, 1, ..., then ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) (sums4's order), times scale.
   Each tile register, read once, serves the G heads. */
static inline __attribute__((always_inline)) void tile_scores(const int G, const float *q, const uint32_t *tiles,
        long shared, long D, float scale, float *s, long room, __m128 *mx) {
    long nb = D / 16;
    uint32_t qw[3][128];  /* the queries' pairs as bf16 words (exact: every value is a bf16) */
    for (int hh = 0; hh < G; ++hh)
        for (long p = 0; p < D / 2; ++p) {
            uint32_t lo, hi;
            __builtin_memcpy(&lo, q + hh * D + 2 * p, 4);
            __builtin_memcpy(&hi, q + hh * D + 2 * p + 1, 4);
            qw[hh][p] = (lo >> 16) | (hi & 0xffff0000u);
        }
    __m512 top[3];
    for (int hh = 0; hh < G; ++hh) top[hh] = _mm512_set1_ps(-__builtin_inff());
    for (long t = 0; t < shared; t += 16) {
        const uint32_t *tile = tiles + t * D / 2;
        __m512 a[3][8];
        UNROLL_ALL for (int hh = 0; hh < G; ++hh)
            for (int l = 0; l < 8; ++l) a[hh][l] = _mm512_setzero_ps();
        for (long b = 0; b < nb; ++b)
            for (int l = 0; l < 8; ++l) {
                __m512bh k = (__m512bh)_mm512_loadu_si512(tile + 16 * (8 * b + l));
                UNROLL_ALL for (int hh = 0; hh < G; ++hh)
                    a[hh][l] = _mm512_dpbf16_ps(a[hh][l], k, (__m512bh)_mm512_set1_epi32((int)qw[hh][8 * b + l]));
            }
        UNROLL_ALL for (int hh = 0; hh < G; ++hh) {
            __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[hh][0], a[hh][1]), _mm512_add_ps(a[hh][2], a[hh][3])),
                                       _mm512_add_ps(_mm512_add_ps(a[hh][4], a[hh][5]), _mm512_add_ps(a[hh][6], a[hh][7])));
            sum = _mm512_mul_ps(sum, _mm512_set1_ps(scale));
            _mm512_storeu_ps(s + hh * room + t, sum);
            top[hh] = _mm512_max_ps(top[hh], sum);
        }
    }
    for (int hh = 0; hh < G; ++hh) {  /* the max of a set: its order does not matter */
        __m512 m = _mm512_max_ps(top[hh], _mm512_shuffle_f32x4(top[hh], top[hh], 0x4e));
        m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0xb1));
        mx[hh] = _mm_max_ps(mx[hh], _mm512_castps512_ps128(m));
    }
}
#endif

static inline __attribute__((always_inline)) void attend_heads512(const int G, const float *q, const uint16_t *kh,
        const uint16_t *vh, const int32_t *ix, long n, long D, float scale, float *s, long room, float *out,
        const uint32_t *tiles, long shared) {
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
#if defined(__AVX512BF16__)
    /* Where every query value is a bf16 (the fused decoder's are), a score takes vdpbf16ps: on a lane it adds the
       pair's odd product, then its even one, each rounded as an FMA rounds (products of two bf16 are exact), which is
       what the fp32 paths do, so the bits are theirs; it treats subnormal inputs and results as zero, where an FMA
       keeps them. qp: block b's 8 pairs as bf16 words, in both halves. */
    __mmask16 low = 0;  /* lanes whose fp32 has bits below a bf16's: G * D is a multiple of 16 */
    for (long i = 0; i < G * D; i += 16)
        low |= _mm512_test_epi32_mask(_mm512_castps_si512(_mm512_loadu_ps(q + i)), _mm512_set1_epi32(0xffff));
    int pairs = low == 0;
    __m512bh qp[3][16];
    for (int hh = 0; hh < G && pairs; ++hh)
        for (long b = 0; b < nb; ++b)
            qp[hh][b] = (__m512bh)_mm512_broadcast_i64x4((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(q + hh * D + 16 * b)));
#endif
    __m128 mx[3];
    for (int hh = 0; hh < G; ++hh) mx[hh] = _mm_set1_ps(-__builtin_inff());
    long j0 = 0;
#if !defined(__AVX512BF16__)
    (void)tiles; (void)shared;  /* no tiles in this build */
#else
    if (pairs && tiles) {  /* the first `shared` keys from their tiles, a key a lane: the same bits (tile_scores) */
        tile_scores(G, q, tiles, shared, D, scale, s, room, mx);
        j0 = shared;
    }
#endif
    for (; j0 < n; j0 += 4) {
        const uint16_t *kr[4];
        for (int i = 0; i < 4; ++i) kr[i] = kh + (long)ix[j0 + i < n ? j0 + i : n - 1] * D;
        __m512 a[3][2];
        for (int hh = 0; hh < G; ++hh) a[hh][0] = a[hh][1] = _mm512_setzero_ps();
        for (long b = 0; b < nb; ++b)
            for (int p = 0; p < 2; ++p) {
                __m512i w = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(kr[2 * p] + 16 * b))),
                    _mm256_loadu_si256((const __m256i *)(kr[2 * p + 1] + 16 * b)), 1);
#if defined(__AVX512BF16__)
                if (pairs) {  /* the same two products a lane, in the same order, on the words as read */
                    for (int hh = 0; hh < G; ++hh) a[hh][p] = _mm512_dpbf16_ps(a[hh][p], (__m512bh)w, qp[hh][b]);
                    continue;
                }
#endif
                __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
                __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(w, high));
                for (int hh = 0; hh < G; ++hh) {
                    a[hh][p] = _mm512_fmadd_ps(wo, qo[hh][b], a[hh][p]);
                    a[hh][p] = _mm512_fmadd_ps(we, qe[hh][b], a[hh][p]);
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
        UNROLL_ALL for (int hh = 0; hh < G; ++hh) ae[hh][0] = ae[hh][1] = ao[hh][0] = ao[hh][1] = _mm512_setzero_ps();
        for (long j = 0; j < n; ++j) {  /* both registers every key (a 0 mask loads zeros, never stored): the loops
                                             unroll, and the accumulators stay in registers */
            const uint16_t *vr = vh + (long)ix[j] * D + 16 * b0;
            __m512 we[2], wo[2];
            UNROLL_ALL for (int pp = 0; pp < 2; ++pp) {
                __m512i w = _mm512_maskz_loadu_epi32(pp ? m1 : m0, vr + 32 * pp);
                we[pp] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
                wo[pp] = _mm512_castsi512_ps(_mm512_and_si512(w, high));
            }
            UNROLL_ALL for (int hh = 0; hh < G; ++hh) {
                __m512 p = _mm512_set1_ps(s[hh * room + j]);
                UNROLL_ALL for (int pp = 0; pp < 2; ++pp) {
                    ae[hh][pp] = _mm512_fmadd_ps(p, we[pp], ae[hh][pp]);
                    ao[hh][pp] = _mm512_fmadd_ps(p, wo[pp], ao[hh][pp]);
                }
            }
        }
        UNROLL_ALL for (int hh = 0; hh < G; ++hh) {
            __m512 inv = _mm512_set1_ps(1.f / sum[hh]);
            UNROLL_ALL for (int pp = 0; pp < 2; ++pp) {
                float e[16], d[16];
                long blocks = left - 2 * pp < 2 ? left - 2 * pp : 2;
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
#define ATTEND_HEADS(G, q, kh, vh, ix, n, D, scale, s, room, out, tiles, shared) \
    ((void)(tiles), (void)(shared), attend_heads(G, q, kh, vh, ix, n, D, scale, s, room, out))  /* none here */
#endif

/* How many of the first keys the rows of a call share that key_tiles should lay out (a multiple of 16): 0 where
   this build has no tiles (AVX2, AVX-512F without BF16), the head size is not a multiple of 32, or rows are few
   (one row reads each key once either way). common: the length of the prefix all rows' visible slots share. */
long key_tiles_for(long rows, long common, long D) {
#if defined(__AVX512BF16__)
    if (rows >= TILE_ROWS && D % 32 == 0 && D <= 256) return common / 16 * 16;
#endif
    (void)rows; (void)common; (void)D;
    return 0;
}

/* One task of attend_bf16: query heads h0 .. h1-1 of one row (q, out: the row's (H, D)), which read one key/value
   head (kh, vh), over the row's n visible positions ix; three at a time through attend_heads, so each cache read
   serves them all. tiles: the head's key tiles of ix's first `shared` keys (key_tiles), or NULL. s: 3 * room floats
   of scratch, room >= n + 16 (score stores run up to 15 past n). */
void attend_task(const float *q, const uint16_t *kh, const uint16_t *vh, float *out, const int32_t *ix, long n,
                 long h0, long h1, long D, float scale, float *s, long room, const uint32_t *tiles, long shared) {
    for (long h = h0; h < h1; h += 3) {
        const float *qh = q + h * D;
        float *oh = out + h * D;
        switch (h1 - h < 3 ? h1 - h : 3) {
            case 1: ATTEND_HEADS(1, qh, kh, vh, ix, n, D, scale, s, room, oh, tiles, shared); break;
            case 2: ATTEND_HEADS(2, qh, kh, vh, ix, n, D, scale, s, room, oh, tiles, shared); break;
            default: ATTEND_HEADS(3, qh, kh, vh, ix, n, D, scale, s, room, oh, tiles, shared); break;
        }
    }
}

/* Row-wise attention over a bf16 KV cache. q (R, H, D) fp32 query rows; k, v: one sequence's cache, key/value
   head j at k + j*hs, position p at + p*D. Row r sees the cache positions idx[off[r] .. off[r+1]), in order.
   Query head h reads key/value head h / (H / KVH). out (R, H, D) fp32 = softmax(q . K^T * scale) . V.
   One task per (row, key/value head) (attend_task). Each (row, head) is one fixed sequence of operations, which
   depends only on its query and its visible keys, so its bits never depend on R. D % 16 == 0, D <= 256. */
void attend_bf16(const float *q, const uint16_t *k, const uint16_t *v, float *out, const int32_t *idx,
                 const int64_t *off, long R, long H, long KVH, long D, long hs, float scale, int threads) {
    long g = H / KVH, maxn = 1;
    for (long r = 0; r < R; ++r) if (off[r + 1] - off[r] > maxn) maxn = off[r + 1] - off[r];
    long room = maxn + 16;
    #pragma omp parallel num_threads(threads)
    {
        float *s = (float *)__builtin_malloc(3 * room * sizeof(float));
        #pragma omp for schedule(static)
        for (long t = 0; t < R * KVH; ++t) {
            long r = t / KVH, j = t % KVH;
            attend_task(q + r * H * D, k + j * hs, v + j * hs, out + r * H * D, idx + off[r], off[r + 1] - off[r],
                        j * g, (j + 1) * g, D, scale, s, room, 0, 0);
        }
        __builtin_free(s);
    }
}
