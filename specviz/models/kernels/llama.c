/* A Llama decoder's layers in one call (llama_layers), in bf16 as transformers computes them on CPU, row by row.

Per layer: h += o(attention(rope(q, k), v)) of rmsnorm(h); h += down(silu(gate) * up) of rmsnorm(h); the matmuls are
packed_matmul's (row-invariant, weights packed at load), the attention attend.c's (one fixed sequence per (row,
head)). Every other step is elementwise or a reduction inside one row, in 8-lane registers in every build, with
torch's bf16 rounding points: rmsnorm rounds x * rsqrt(mean(x^2) + eps) to bf16, then its product with the weight;
rope rounds q * cos, rotate_half(q) * sin and their sum; silu(gate) and its product with up are rounded; each
residual sum is rounded. So a row's bits depend only on the row, its position and the keys it sees: one token
alone gets the bits it gets among drafts, and no padding row is needed. One parallel region runs all the layers:
its threads claim each phase's chunks (a matmul's column groups, rows, (row, head) pairs) as they come (RUN_PHASE). */
#include <omp.h>

#ifdef PHASE_TIMES
static void phase_waited(double ns);
#define PHASE_WAITED(ns) phase_waited(ns)  /* RUN_PHASE's waits, added to the phase timers below */
#endif
#include "packed.h"

#define PHASES 11  /* a layer's phases (RUN_PHASE) */
#define TIMERS 10  /* the phases -DPHASE_TIMES times (TIMED's first argument; the key tiles count as attention) */
#ifndef LAYER_CHUNK
#define LAYER_CHUNK 4  /* matmul column groups (32 outputs each) a claim (a -D flag: experiments/probes/kernel_ab.py);
                          4 rather than 2 lets 3 of 4 groups prefetch the next (packed_linear.c: NEXT_GROUP) */
#endif
#define CHUNK LAYER_CHUNK

/* -DPHASE_TIMES (experiments/probes/phase_times.py): each thread adds the nanoseconds it spends in each of a layer's
   phases, and of those the ones it spends waiting for the others, to phase_ns; llama_phase_times reads and clears
   them. Off by default: the phases then run as written. */
#ifdef PHASE_TIMES
static double phase_ns[TIMERS][2][2];  /* phase, thread (0, 1), {in the phase, waiting} */
static __thread int phase_now;
#define TIMED(i, ...) do {                                                                          \
        int t_ = omp_get_thread_num() & 1;                                                        \
        double s_ = now_ns();                                                                     \
        phase_now = (i);                                                                          \
        __VA_ARGS__;                                                                              \
        phase_ns[i][t_][0] += now_ns() - s_;                                                      \
    } while (0)
static void phase_waited(double ns) { phase_ns[phase_now][omp_get_thread_num() & 1][1] += ns; }
void llama_phase_times(double *out) {
    __builtin_memcpy(out, phase_ns, sizeof phase_ns);
    __builtin_memset(phase_ns, 0, sizeof phase_ns);
}
#else
#define TIMED(i, ...) __VA_ARGS__
#endif

static inline long chunks(long N) { return (packed_groups(N) + CHUNK - 1) / CHUNK; }

/* chunk c of the matmul y (M, N) (+)= x (M, K) . W^T: its CHUNK column groups */
static inline void matmul_chunk(long c, const xin_t *x, int64_t w, long M, long K, long N, uint16_t *y, int mode) {
    long end = (c + 1) * CHUNK < packed_groups(N) ? (c + 1) * CHUNK : packed_groups(N);
    packed_matmul(x, K, (const uint16_t *)w, M, K, N, y, N, mode, c * CHUNK, end);
}

/* exp of each lane (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n), x clamped to [-87, 88] */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(_mm256_mul_ps(y, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* out = weight * bf16(x * rsqrt(mean(x^2) + eps)), one row of d (d % 8 == 0); the sum of squares in 8 lanes, then
   hsum's fixed order. out: bf16, or with `as_x` the packed matmul's input (xin_t: the same values) */
static inline void rmsnorm_row(const uint16_t *x, const uint16_t *weight, void *out, long d, float eps, int as_x) {
    __m256 acc = _mm256_setzero_ps();
    for (long k = 0; k < d; k += 8) {
        __m256 v = load8_bf16(x + k);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
    }
    float mean = hsum(acc) / (float)d;
    __m256 scale = _mm256_set1_ps(1.0f / __builtin_sqrtf(mean + eps));
    for (long k = 0; k < d; k += 8) {
        __m256 normed = round8_bf16(_mm256_mul_ps(load8_bf16(x + k), scale));
        __m256 v = round8_bf16(_mm256_mul_ps(normed, load8_bf16(weight + k)));
        if (as_x) store8_x((xin_t *)out + k, v); else store8_bf16((uint16_t *)out + k, v);
    }
}

/* rmsnorm over n rows (the final norm), single-threaded */
void rmsnorm_rows(const uint16_t *x, const uint16_t *weight, uint16_t *out, long n, long d, float eps) {
    for (long r = 0; r < n; ++r) rmsnorm_row(x + r * d, weight, out + r * d, d, eps, 0);
}

/* heads x (hd) at x, in place: x * cos + rotate_half(x) * sin, each product and the sum rounded to bf16 */
static void rope_heads(uint16_t *x, long heads, long hd, const uint16_t *cos, const uint16_t *sin) {
    long half = hd / 2;
    for (long h = 0; h < heads; ++h) {
        uint16_t *xh = x + h * hd;
        for (long j = 0; j < half; j += 8) {
            __m256 x1 = load8_bf16(xh + j), x2 = load8_bf16(xh + half + j);
            __m256 a = _mm256_sub_ps(round8_bf16(_mm256_mul_ps(x1, load8_bf16(cos + j))),
                                     round8_bf16(_mm256_mul_ps(x2, load8_bf16(sin + j))));
            __m256 b = _mm256_add_ps(round8_bf16(_mm256_mul_ps(x2, load8_bf16(cos + half + j))),
                                     round8_bf16(_mm256_mul_ps(x1, load8_bf16(sin + half + j))));
            store8_bf16(xh + j, round8_bf16(a));
            store8_bf16(xh + half + j, round8_bf16(b));
        }
    }
}

/* out[j] = bf16(bf16(silu(gate[j])) * up[j]), silu(g) = g / (1 + exp(-g)) as torch computes it; out: the packed
   matmul's input (xin_t) */
static void silu_mul_row(const uint16_t *gate, const uint16_t *up, xin_t *out, long f) {
    for (long j = 0; j < f; j += 8) {
        __m256 g = load8_bf16(gate + j);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 s = round8_bf16(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
        store8_x(out + j, round8_bf16(_mm256_mul_ps(s, load8_bf16(up + j))));
    }
}

/* the rows' rope positions at[r] and their visible slots span[2r] .. span[2r+1] of the index returned (llama_layers'
   rules: pos NULL: slot0 + r; off NULL: causal, as the index 0 .. slot0 + n - 1; lead (always with off): row r sees
   slots 0 .. lead[r] - 1, then base + idx[off[r] .. off[r+1]), spelled out here). *made: the index made here (the
   caller frees it), or NULL where it is idx itself */
static const int32_t *row_spans(long n, const int64_t *pos, long slot0, const int32_t *idx, const int64_t *off,
                                const int64_t *lead, long base, int64_t *at, int64_t *span, int32_t **made) {
    for (long r = 0; r < n; ++r) at[r] = pos ? pos[r] : slot0 + r;
    *made = 0;
    if (off && !lead) {
        for (long r = 0; r < n; ++r) span[2 * r] = off[r], span[2 * r + 1] = off[r + 1];
        return idx;
    }
    long total = lead ? 0 : slot0 + n;
    for (long r = 0; lead && r < n; ++r) total += lead[r] + off[r + 1] - off[r];
    int32_t *out = *made = (int32_t *)__builtin_malloc((total + 1) * sizeof(int32_t));
    if (!lead) {  /* causal: every row's span is a prefix of one index 0 .. slot0 + n - 1 */
        for (long i = 0; i < slot0 + n; ++i) out[i] = (int32_t)i;
        for (long r = 0; r < n; ++r) span[2 * r] = 0, span[2 * r + 1] = slot0 + r + 1;
        return out;
    }
    for (long r = 0, k = 0; r < n; ++r) {
        span[2 * r] = k;
        for (long i = 0; i < lead[r]; ++i) out[k++] = (int32_t)i;
        for (long j = off[r]; j < off[r + 1]; ++j) out[k++] = (int32_t)(base + idx[j]);
        span[2 * r + 1] = k;
    }
    return out;
}

/* one row's q|k|v (qkvd wide) at position `at`: (qk_norm: the q and k head norms' weights, hd each, or NULL) each
   head normed, rope on q and k, k and v into cache slot `slot` (caches (KVH, hs)),
   q to fp32 for attention */
static void rope_store_row(uint16_t *row, long at, long slot, const uint16_t *cos, const uint16_t *sin, uint16_t *kc,
                           uint16_t *vc, long hs, long H, long KVH, long hd, float *q32, const uint16_t *const *qk_norm,
                           float eps) {
    long qd = H * hd;
    if (qk_norm)  /* DFlash's layers: each query and key head RMS-normed (q_norm, k_norm) before rope */
        for (long h = 0; h < H + KVH; ++h) rmsnorm_row(row + h * hd, qk_norm[h >= H], row + h * hd, hd, eps, 0);
    rope_heads(row, H + KVH, hd, cos + at * hd, sin + at * hd);
    for (long j = 0; j < KVH; ++j) {
        __builtin_memcpy(kc + j * hs + slot * hd, row + qd + j * hd, hd * 2);
        __builtin_memcpy(vc + j * hs + slot * hd, row + qd + (KVH + j) * hd, hd * 2);
    }
    for (long i = 0; i < qd; ++i) q32[i] = bf16_to_float(row[i]);
}

/* a layer's shape and the buffers its phases share (one call's rows; scratch_alloc / scratch_free) */
typedef struct {
    long n, d, hd, H, KVH, F, qd, qkvd, g, hs, slot0;
    float eps, scale;
    const int32_t *idx;                /* the visible slots, per row span[2r] .. span[2r+1] (row_spans) */
    int64_t *at, *span;                /* rows' rope positions; their [begin, end) into idx */
    int32_t *made;                     /* the index row_spans made, or NULL */
    uint16_t *qkv, *gu;                /* q|k|v and gate|up outputs, bf16 */
    xin_t *xn, *att, *act;             /* the matmuls' inputs, as they read them: norms', attention's, the MLP's */
    float *q32, *o32;                  /* attention's fp32 queries and outputs */
    float *scores;                     /* attention's scratch: 3 x room floats a thread */
    long room;
    long shared;                       /* the first keys every row sees, laid out as key tiles (attend.c), or 0 */
    uint32_t *tiles;                   /* their tiles: shared * hd / 2 words a key/value head */
} layer_t;

/* the shape and buffers for n rows of width d (xn: xn_width a row) at the positions and spans llama_layers takes */
static layer_t layer_alloc(long n, long d, long xn_width, long hd, long H, long KVH, long F, long cap, long slot0,
                           const int64_t *pos, const int32_t *idx, const int64_t *off, const int64_t *lead, long base,
                           float eps, float scale, int threads) {
    layer_t L = {n, d, hd, H, KVH, F, H * hd, (H + 2 * KVH) * hd, H / KVH, cap * hd, slot0, eps, scale,
                 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    L.qkv = (uint16_t *)__builtin_malloc(n * L.qkvd * 2);
    L.gu = (uint16_t *)__builtin_malloc(n * 2 * F * 2);
    L.xn = (xin_t *)__builtin_malloc(n * xn_width * sizeof(xin_t));
    L.att = (xin_t *)__builtin_malloc(n * L.qd * sizeof(xin_t));
    L.act = (xin_t *)__builtin_malloc(n * F * sizeof(xin_t));
    L.q32 = (float *)__builtin_malloc(n * L.qd * 4);
    L.o32 = (float *)__builtin_malloc(n * L.qd * 4);
    L.at = (int64_t *)__builtin_malloc(n * 3 * sizeof(int64_t));
    L.span = L.at + n;
    L.idx = row_spans(n, pos, slot0, idx, off, lead, base, L.at, L.span, &L.made);
    for (long r = 0; r < n; ++r)
        if (L.span[2 * r + 1] - L.span[2 * r] + 16 > L.room) L.room = L.span[2 * r + 1] - L.span[2 * r] + 16;
    L.scores = (float *)__builtin_malloc(threads * 3 * L.room * sizeof(float));
    long common = n ? L.span[1] - L.span[0] : 0;  /* the longest prefix of visible slots all rows share */
    for (long r = 1; r < n && common; ++r) {
        long len = L.span[2 * r + 1] - L.span[2 * r], i = 0;
        const int32_t *a = L.idx + L.span[0], *b = L.idx + L.span[2 * r];
        while (i < common && i < len && a[i] == b[i]) ++i;
        common = i;
    }
    L.shared = key_tiles_for(n, common, hd);
    L.tiles = L.shared ? (uint32_t *)__builtin_malloc(KVH * L.shared * hd / 2 * 4) : 0;
    return L;
}

static void layer_free(layer_t *L) {
    __builtin_free(L->qkv); __builtin_free(L->gu); __builtin_free(L->xn); __builtin_free(L->att);
    __builtin_free(L->act); __builtin_free(L->q32); __builtin_free(L->o32); __builtin_free(L->at);
    __builtin_free(L->made); __builtin_free(L->scores); __builtin_free(L->tiles);
}

/* A layer after its q|k|v matmul, as llama_layers, eagle3_step and dflash_block run it (8 phases from ph, inside the
   caller's parallel region): (qk_norm: DFlash's q and k head norms, else NULL) rope and the cache, the shared keys'
   tiles (where the rows share L->shared keys; the attention's bits are the same without them), attention,
   h += o(.), the post-attention norm, h += down(silu(gate) * up). w: the o, post-attention norm, gate|up and down
   addresses; kc, vc: this layer's cache. */
static void layer_rest(const layer_t *L, phase_t *ph, uint16_t *h, const int64_t *w, uint16_t *kc, uint16_t *vc,
                       const uint16_t *cos, const uint16_t *sin, const uint16_t *const *qk_norm) {
    long n = L->n, d = L->d, hd = L->hd, KVH = L->KVH, F = L->F, qd = L->qd, g = L->g, hs = L->hs;
    TIMED(2, RUN_PHASE(ph + 0, n, r, rope_store_row(L->qkv + r * L->qkvd, L->at[r], L->slot0 + r, cos, sin, kc, vc,
                                                    hs, L->H, KVH, hd, L->q32 + r * qd, qk_norm, L->eps)));
    long words = L->shared * hd / 2;  /* a key/value head's tiles */
    TIMED(3, {
#ifdef HAVE_KEY_TILES
        if (L->shared)  /* 16 keys of one key/value head a task */
            RUN_PHASE(ph + 1, KVH * (L->shared / 16), t, key_tiles(kc + (t % KVH) * hs, L->idx + L->span[0], t / KVH,
                                                                   hd, L->tiles + (t % KVH) * words));
#endif
        RUN_PHASE(ph + 2, n * KVH, t, {  /* one (row, key/value head) a task, its query heads together */
            long r = t / KVH, j = t % KVH, o = r * qd + j * g * hd;
            attend_task(L->q32 + r * qd, kc + j * hs, vc + j * hs, L->o32 + r * qd, L->idx + L->span[2 * r],
                        L->span[2 * r + 1] - L->span[2 * r], j * g, (j + 1) * g, hd, L->scale,
                        L->scores + omp_get_thread_num() * 3 * L->room, L->room,
                        L->shared ? L->tiles + j * words : 0, L->shared);
            for (long i = 0; i < g * hd; ++i) L->att[o + i] = x_of_bf16(float_to_bf16(L->o32[o + i]));
        });
    });
    TIMED(4, RUN_PHASE(ph + 3, chunks(d), c, matmul_chunk(c, L->att, w[0], n, qd, d, h, ADD_BF16)));
    TIMED(5, RUN_PHASE(ph + 4, n, r, rmsnorm_row(h + r * d, (const uint16_t *)w[1], L->xn + r * d, d, L->eps, 1)));
    TIMED(6, RUN_PHASE(ph + 5, chunks(2 * F), c, matmul_chunk(c, L->xn, w[2], n, d, 2 * F, L->gu, STORE_BF16)));
    TIMED(7, RUN_PHASE(ph + 6, n, r, silu_mul_row(L->gu + r * 2 * F, L->gu + r * 2 * F + F, L->act + r * F, F)));
    TIMED(8, RUN_PHASE(ph + 7, chunks(d), c, matmul_chunk(c, L->act, w[3], n, F, d, h, ADD_BF16)));
}

/* Layers l0 .. l1-1 over h (n, d) bf16, in place. Row r sits at position pos[r] (rope) and cache slot slot0 + r, and
   attends over the slots idx[off[r] .. off[r+1]) (attend.c); with lead, over the slots 0 .. lead[r] - 1 and then base
   + idx[off[r] .. off[r+1]) (a tree's rows: the context, then their ancestors and themselves); pos NULL: positions
   slot0 + r; off and lead NULL: causal, row r over the slots 0 .. slot0 + r (idx unused). weights: 6 addresses a
   layer: input norm (d), q|k|v packed ((H + 2 KVH) hd rows), o packed (d rows), post-attention norm (d), gate|up
   packed (2 F rows), down packed (d rows). caches: 2 addresses a layer: keys, values, each (KVH, cap, hd) bf16. cos,
   sin: (positions, hd) bf16 tables. states (l1 - l0, n, d) or NULL: h after each layer. d, hd, F multiples of 16. */
void llama_layers(uint16_t *h, long n, const int64_t *pos, long slot0, const uint16_t *cos, const uint16_t *sin,
                  const int64_t *weights, const int64_t *caches, long cap, const int32_t *idx, const int64_t *off,
                  const int64_t *lead, long base, long l0, long l1, uint16_t *states, long d, long hd, long H, long KVH,
                  long F, float eps, float scale, int threads) {
    layer_t L = layer_alloc(n, d, d, hd, H, KVH, F, cap, slot0, pos, idx, off, lead, base, eps, scale, threads);
    phase_t *phases = (phase_t *)__builtin_calloc((l1 - l0) * PHASES, sizeof(phase_t));
    #pragma omp parallel num_threads(threads)
    for (long l = l0; l < l1; ++l) {
        const int64_t *wl = weights + 6 * l;
        phase_t *ph = phases + (l - l0) * PHASES;
        TIMED(0, RUN_PHASE(ph + 0, n, r, rmsnorm_row(h + r * d, (const uint16_t *)wl[0], L.xn + r * d, d, eps, 1)));
        TIMED(1, RUN_PHASE(ph + 1, chunks(L.qkvd), c, matmul_chunk(c, L.xn, wl[1], n, d, L.qkvd, L.qkv, STORE_BF16)));
        layer_rest(&L, ph + 2, h, wl + 2, (uint16_t *)caches[2 * l], (uint16_t *)caches[2 * l + 1], cos, sin, 0);
        if (states)
            RUN_PHASE(ph + 10, n, r, __builtin_memcpy(states + ((l - l0) * n + r) * d, h + r * d, d * 2));
    }
    __builtin_free(phases);
    layer_free(&L);
}

/* y (n, d) bf16 rows += bias, each sum rounded (torch's `linear(x) + bias` in bf16 on the rounded product) */
static void add_bias_row(uint16_t *y, const uint16_t *bias, long d) {
    for (long k = 0; k < d; k += 8) store8_bf16(y + k, round8_bf16(_mm256_add_ps(load8_bf16(y + k), load8_bf16(bias + k))));
}

/* 8 bf16 -> the packed matmul's input (xin_t), exact */
static void to_x_row(const uint16_t *x, xin_t *out, long d) {
    for (long k = 0; k < d; k += 8) store8_x(out + k, load8_bf16(x + k));
}

/* EAGLE-3's draft step in one call (drafters/modules.py: Eagle3.lift and Eagle3Layer), with the rounding
   points of the torch module on the packed matmul (its attention is attend.c's). For n rows at positions pos (their
   rope) written to the drafter's cache slots slot0 .. slot0 + n - 1, attending as llama_layers' rows do (idx/off, or
   causal when off is NULL):
     feats (n, nf) bf16 or NULL: the target's fused features, lifted by fc (+ bias) into `hidden`; with NULL, `hidden`
       (n, d) already holds the inputs (the previous step's outputs);
     a = o(attention(rope(q, k), v)) of [rmsnorm(emb), rmsnorm(hidden)] (2 d wide); hidden += a;
     hidden += down(silu(gate) * up) of rmsnorm(hidden).
   weights: 9 addresses: fc packed (d rows of nf), fc bias (d) or 0, input norm (d), hidden norm (d), q|k|v packed
   ((H + 2 KVH) hd rows of 2 d), o packed (d rows), post-attention norm (d), gate|up packed (2 F rows), down packed
   (d rows). kc, vc: the cache (KVH, cap, hd) bf16 each. cos, sin: (positions, hd) bf16 tables. */
void eagle3_step(const uint16_t *feats, long nf, uint16_t *hidden, const uint16_t *emb, long n,
                 const int64_t *pos, long slot0, const uint16_t *cos, const uint16_t *sin, const int64_t *weights,
                 uint16_t *kc, uint16_t *vc, long cap, const int32_t *idx, const int64_t *off, long d, long hd, long H,
                 long KVH, long F, float eps, float scale, int threads) {
    long d2 = 2 * d;
    layer_t L = layer_alloc(n, d, d2, hd, H, KVH, F, cap, slot0, pos, idx, off, 0, 0, eps, scale, threads);
    xin_t *fx = feats ? (xin_t *)__builtin_malloc(n * nf * sizeof(xin_t)) : 0;
    const uint16_t *fc_bias = (const uint16_t *)weights[1];
    phase_t ph[13] = {{0}};
    #pragma omp parallel num_threads(threads)
    {
        if (feats) {
            RUN_PHASE(ph + 0, n, r, to_x_row(feats + r * nf, fx + r * nf, nf));
            RUN_PHASE(ph + 1, chunks(d), c, matmul_chunk(c, fx, weights[0], n, nf, d, hidden, STORE_BF16));
            if (fc_bias) RUN_PHASE(ph + 2, n, r, add_bias_row(hidden + r * d, fc_bias, d));
        }
        RUN_PHASE(ph + 3, n, r, {
            rmsnorm_row(emb + r * d, (const uint16_t *)weights[2], L.xn + r * d2, d, eps, 1);
            rmsnorm_row(hidden + r * d, (const uint16_t *)weights[3], L.xn + r * d2 + d, d, eps, 1);
        });
        RUN_PHASE(ph + 4, chunks(L.qkvd), c, matmul_chunk(c, L.xn, weights[4], n, d2, L.qkvd, L.qkv, STORE_BF16));
        layer_rest(&L, ph + 5, hidden, weights + 5, kc, vc, cos, sin, 0);
    }
    __builtin_free(fx);
    layer_free(&L);
}

/* EAGLE-3's context step and the first draft logits in one call: eagle3_step over n rows whose embeddings are the rows
   ids[r] of `table` (the target's, bf16), at positions slot0 + r, causal, from the target's features; then the
   module's readout (its final norm, `norm`) of the last row and the draft head (packed, N rows) into logits (N floats,
   each the bf16 rounding of its sum): what fused.FusedEagle3.step, .readout and the packed head compute in three
   calls and a dozen small torch operations. hidden: (n, d) bf16, the rows' outputs. */
void eagle3_context(const uint16_t *feats, long nf, uint16_t *hidden, const uint16_t *table, const int64_t *ids, long n,
                    long slot0, const uint16_t *cos, const uint16_t *sin, const int64_t *weights, uint16_t *kc,
                    uint16_t *vc, long cap, long d, long hd, long H, long KVH, long F, float eps, float scale,
                    const uint16_t *norm, const uint16_t *head, long N, float *logits, int threads) {
    uint16_t *emb = (uint16_t *)__builtin_malloc((n * d + d) * 2), *x = emb + n * d;
    for (long r = 0; r < n; ++r) __builtin_memcpy(emb + r * d, table + ids[r] * d, d * 2);
    eagle3_step(feats, nf, hidden, emb, n, 0, slot0, cos, sin, weights, kc, vc, cap, 0, 0, d, hd, H, KVH, F, eps, scale,
                threads);
    rmsnorm_row(hidden + (n - 1) * d, norm, x, d, eps, 0);
    linear_packed(x, head, logits, 1, d, N, STORE_F32, threads);
    __builtin_free(emb);
}

/* DFlash's context rows in one call (drafters/dflash.py: DFlash.context_kv): the target's fused states feats (n, nf)
   bf16 at positions slot0 .. slot0 + n - 1, through fc (packed, d rows of nf) and hidden_norm, then each layer's keys
   (its k_proj, k_norm per head, rope) and values (v_proj) into its cache slots slot0 ... weights: fc packed, hidden_norm
   (d), then 2 a layer: k|v packed (2 KVH hd rows of d), k_norm (hd). caches: 2 addresses a layer, (KVH, cap, hd) bf16
   each. The torch module's rounding points on the packed matmul. */
void dflash_context(const uint16_t *feats, long nf, long n, long slot0, const uint16_t *cos, const uint16_t *sin,
                    const int64_t *weights, const int64_t *caches, long cap, long layers, long d, long hd, long KVH,
                    float eps, int threads) {
    long kvd = 2 * KVH * hd, hs = cap * hd;
    xin_t *fx = (xin_t *)__builtin_malloc((n * nf + n * d) * sizeof(xin_t)), *cx = fx + n * nf;
    uint16_t *ctx = (uint16_t *)__builtin_malloc((n * d + n * kvd) * 2), *kv = ctx + n * d;
    phase_t *ph = (phase_t *)__builtin_calloc(3 + 2 * layers, sizeof(phase_t));
    #pragma omp parallel num_threads(threads)
    {
        RUN_PHASE(ph + 0, n, r, to_x_row(feats + r * nf, fx + r * nf, nf));
        RUN_PHASE(ph + 1, chunks(d), c, matmul_chunk(c, fx, weights[0], n, nf, d, ctx, STORE_BF16));
        RUN_PHASE(ph + 2, n, r, rmsnorm_row(ctx + r * d, (const uint16_t *)weights[1], cx + r * d, d, eps, 1));
        for (long l = 0; l < layers; ++l) {
            const int64_t *wl = weights + 2 + 2 * l;
            uint16_t *kc = (uint16_t *)caches[2 * l], *vc = (uint16_t *)caches[2 * l + 1];
            RUN_PHASE(ph + 3 + 2 * l, chunks(kvd), c, matmul_chunk(c, cx, wl[0], n, d, kvd, kv, STORE_BF16));
            RUN_PHASE(ph + 4 + 2 * l, n, r, {
                uint16_t *row = kv + r * kvd;
                for (long j = 0; j < KVH; ++j) {
                    rmsnorm_row(row + j * hd, (const uint16_t *)wl[1], row + j * hd, hd, eps, 0);
                    rope_heads(row + j * hd, 1, hd, cos + (slot0 + r) * hd, sin + (slot0 + r) * hd);
                    __builtin_memcpy(kc + j * hs + (slot0 + r) * hd, row + j * hd, hd * 2);
                    __builtin_memcpy(vc + j * hs + (slot0 + r) * hd, row + (KVH + j) * hd, hd * 2);
                }
            });
        }
    }
    __builtin_free(ph);
    __builtin_free(ctx);
    __builtin_free(fx);
}

/* DFlash's block in one call (drafters/dflash.py: DFlash.forward, then the target's LM head on the slots after the
   first): n rows, the embeddings (rows ids[r] of `table`, the target's, bf16) of the committed token and the mask
   tokens after it, at positions and cache slots slot0 .. slot0 + n - 1, each row seeing every slot 0 .. slot0 + n - 1
   (the context dflash_context wrote, then the whole block: bidirectional). Each layer is a Llama layer whose query and
   key heads are RMS-normed (q_norm, k_norm) before rope. weights: 8 a layer: llama_layers' 6, q_norm (hd), k_norm
   (hd). Then the module's norm (d) of rows 1 .. n - 1 and the draft head (packed, N rows) into logits ((n - 1), N)
   float32, each the bf16 rounding of its sum. hidden (n, d) bf16: the rows' outputs before the norm. */
void dflash_block(const uint16_t *table, const int64_t *ids, long n, long slot0, const uint16_t *cos,
                  const uint16_t *sin, const int64_t *weights, const int64_t *caches, long cap, long layers,
                  uint16_t *hidden, long d, long hd, long H, long KVH, long F, float eps, float scale,
                  const uint16_t *norm, const uint16_t *head, long N, float *logits, int threads) {
    int64_t *lead = (int64_t *)__builtin_malloc((2 * n + 1) * sizeof(int64_t)), *off = lead + n;
    for (long r = 0; r < n; ++r) lead[r] = slot0 + n, off[r] = 0;
    off[n] = 0;
    for (long r = 0; r < n; ++r) __builtin_memcpy(hidden + r * d, table + ids[r] * d, d * 2);
    layer_t L = layer_alloc(n, d, d, hd, H, KVH, F, cap, slot0, 0, 0, off, lead, 0, eps, scale, threads);
    phase_t *phases = (phase_t *)__builtin_calloc(layers * PHASES, sizeof(phase_t));
    #pragma omp parallel num_threads(threads)
    for (long l = 0; l < layers; ++l) {
        const int64_t *wl = weights + 8 * l;
        const uint16_t *qk_norm[2] = {(const uint16_t *)wl[6], (const uint16_t *)wl[7]};
        phase_t *ph = phases + l * PHASES;
        RUN_PHASE(ph + 0, n, r, rmsnorm_row(hidden + r * d, (const uint16_t *)wl[0], L.xn + r * d, d, eps, 1));
        RUN_PHASE(ph + 1, chunks(L.qkvd), c, matmul_chunk(c, L.xn, wl[1], n, d, L.qkvd, L.qkv, STORE_BF16));
        layer_rest(&L, ph + 2, hidden, wl + 2, (uint16_t *)caches[2 * l], (uint16_t *)caches[2 * l + 1], cos, sin,
                   qk_norm);
    }
    uint16_t *x = (uint16_t *)__builtin_malloc(n * d * 2);
    for (long r = 1; r < n; ++r) rmsnorm_row(hidden + r * d, norm, x + (r - 1) * d, d, eps, 0);
    linear_packed(x, head, logits, n - 1, d, N, STORE_F32, threads);
    __builtin_free(x);
    __builtin_free(phases);
    layer_free(&L);
    __builtin_free(lead);
}
