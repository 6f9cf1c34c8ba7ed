"""A row-invariant bf16 matmul for CPUs without native bf16 (AVX2), compiled at first use.

Why: decode steps stream the weights, and bf16 halves them; but where the CPU has no bf16 instructions
torch emulates bf16 matmuls at about one row's cost per row (the default target's LM head: 5, 8, 11, 16
ms for 1-4 rows, 56 ms for 16), so verifying k tokens costs about k steps and speculation cannot pay. This
kernel streams each weight row once for up to 8 activation rows: it widens bf16 to fp32 in registers
(a 16-bit shift), multiplies-adds with AVX2 FMA in fp32 and rounds the result to bf16. Each output is one
fixed sequence of operations over k, whatever the number of rows, so a row's bits never depend on the
other rows: verification stays bitwise one-token decoding with no padding row.

The C source below is compiled once with the system C compiler into a per-user cache (about a second) and
called through ctypes. Where there is no compiler, or the CPU lacks AVX2/FMA, `available()` is False and
the stock torch kernels run (a Space's image without gcc, say); nothing else changes.
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

/* exp of 8 lanes (x <= 0 here: scores minus their max), Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r,
   times 2^n; within 2 ulp of expf, and the same bits for the same input whatever the other lanes. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  /* exp(-87) ~ 1.6e-38: nothing next to the max's 1 */
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

/* the 8 sums of a[0..7]'s lanes, as one vector (lane i: a[i]'s sum) */
static inline __m256 sums8(const __m256 *a) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Row-wise attention over a bf16 KV cache. q (R, H, D) fp32 query rows; k, v: one sequence's cache, key/value
   head j at k + j*hs, position p at + p*D. Row r sees the cache positions idx[off[r] .. off[r+1]), in order.
   Query head h reads key/value head h / (H / KVH). out (R, H, D) fp32 = softmax(q . K^T * scale) . V.
   Each (row, head) is one thread's fixed sequence of operations, which depends only on its query and its
   visible keys, so its bits never depend on R. A cache row is read 16 values at a time as 8 words: a shift
   gives its even values in fp32, a mask its odd ones (no widening shuffles); the query is split the same way,
   and the output joined back. Scores go 8 keys at a time (a last short block repeats its last key and drops
   the extra lanes), the exponentials 8 at a time (exp8), the values one key at a time. D % 16 == 0, D <= 256. */
void attend_bf16(const float *q, const uint16_t *k, const uint16_t *v, float *out, const int32_t *idx,
                 const int64_t *off, long R, long H, long KVH, long D, long hs, float scale, int threads) {
    long g = H / KVH, maxn = 1;
    for (long r = 0; r < R; ++r) if (off[r + 1] - off[r] > maxn) maxn = off[r + 1] - off[r];
    #pragma omp parallel num_threads(threads)
    {
        float *s = (float *)__builtin_malloc((maxn + 8) * sizeof(float));
        const __m256 high = _mm256_castsi256_ps(_mm256_set1_epi32((int)0xffff0000u));
        __m256 qe[16], qo[16], ae[16], ao[16];
        #pragma omp for schedule(static)
        for (long t = 0; t < R * H; ++t) {
            long r = t / H, h = t % H, n = off[r + 1] - off[r], nb = D / 16;
            const float *qr = q + t * D;
            const uint16_t *kh = k + (h / g) * hs, *vh = v + (h / g) * hs;
            const int32_t *ix = idx + off[r];
            for (long b = 0; b < nb; ++b) {  /* the query's even and odd values of each block of 16 */
                float e[8], o[8];
                for (int i = 0; i < 8; ++i) { e[i] = qr[16 * b + 2 * i]; o[i] = qr[16 * b + 2 * i + 1]; }
                qe[b] = _mm256_loadu_ps(e);
                qo[b] = _mm256_loadu_ps(o);
            }
            __m256 mx = _mm256_set1_ps(-__builtin_inff());
            for (long j0 = 0; j0 < n; j0 += 8) {
                const uint16_t *kr[8];
                for (int i = 0; i < 8; ++i) kr[i] = kh + (long)ix[j0 + i < n ? j0 + i : n - 1] * D;
                __m256 a[8];
                for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
                for (long b = 0; b < nb; ++b)
                    for (int i = 0; i < 8; ++i) {
                        __m256 w = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(kr[i] + 16 * b)));
                        a[i] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(w), 16)), qe[b], a[i]);
                        a[i] = _mm256_fmadd_ps(_mm256_and_ps(w, high), qo[b], a[i]);
                    }
                __m256 sc = _mm256_mul_ps(sums8(a), _mm256_set1_ps(scale));
                _mm256_storeu_ps(s + j0, sc);  /* lanes past n are copies of the last key's score */
                mx = _mm256_max_ps(mx, sc);
            }
            float lanes[8], m;
            _mm256_storeu_ps(lanes, mx);
            m = lanes[0];
            for (int i = 1; i < 8; ++i) if (lanes[i] > m) m = lanes[i];
            __m256 total = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
            for (long j0 = 0; j0 < n; j0 += 8) {
                __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j0), mv));
                if (n - j0 < 8) {  /* zero the lanes past n */
                    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                    e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j0)), lane)));
                }
                _mm256_storeu_ps(s + j0, e);
                total = _mm256_add_ps(total, e);
            }
            float sum = hsum(total);
            for (long b = 0; b < nb; ++b) ae[b] = ao[b] = _mm256_setzero_ps();
            for (long j = 0; j < n; ++j) {
                const uint16_t *vr = vh + (long)ix[j] * D;
                __m256 p = _mm256_set1_ps(s[j]);
                for (long b = 0; b < nb; ++b) {
                    __m256 w = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(vr + 16 * b)));
                    ae[b] = _mm256_fmadd_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(w), 16)), ae[b]);
                    ao[b] = _mm256_fmadd_ps(p, _mm256_and_ps(w, high), ao[b]);
                }
            }
            __m256 inv = _mm256_set1_ps(1.f / sum);
            float *o = out + t * D;
            for (long b = 0; b < nb; ++b) {
                float e[8], d[8];
                _mm256_storeu_ps(e, _mm256_mul_ps(ae[b], inv));
                _mm256_storeu_ps(d, _mm256_mul_ps(ao[b], inv));
                for (int i = 0; i < 8; ++i) { o[16 * b + 2 * i] = e[i]; o[16 * b + 2 * i + 1] = d[i]; }
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


def _build() -> ctypes.CDLL | None:
    """Compile SOURCE once per source version into ~/.cache/specviz (or a temp folder) and load it."""
    if not {"avx2", "fma"} <= cpu_flags():
        return None
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    folder = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specviz"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / "specviz-kernels"
        folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"linear_bf16-{digest}.so"
    if not lib.exists():
        src = folder / f"linear_bf16-{digest}.c"
        src.write_text(SOURCE)
        tmp = folder / f"linear_bf16-{digest}.{os.getpid()}.so"
        cc = os.environ.get("CC", "cc")
        try:
            subprocess.run([cc, "-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-shared", str(src), "-o", str(tmp), "-lm"],
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
                _lib = _build()
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
           scale: float) -> torch.Tensor:
    """query (q, h, d) fp32; key, value (h_kv, kv, d) bf16 with rows of d contiguous; row i attends over the
    cache positions index[offsets[i]:offsets[i + 1]] (int32, int64). Returns (q, h, d) fp32."""
    q_len, h, d = query.shape
    if key.stride(-1) != 1 or key.stride(-2) != d or value.stride() != key.stride():
        key, value = key.contiguous(), value.contiguous()
    query = query.contiguous()
    out = torch.empty_like(query)
    # a step's rows are microseconds of work: one thread, no fork/join (threads never change the bits)
    count = threads() if index.numel() * h >= ATTEND_PARALLEL else 1
    _lib.attend_bf16(query.data_ptr(), key.data_ptr(), value.data_ptr(), out.data_ptr(), index.data_ptr(),
                     offsets.data_ptr(), q_len, h, key.shape[0], d, key.stride(0), scale, count)
    return out


def can_attend(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether `attend` takes this call: one sequence, a bf16 cache on CPU, head size a multiple of 16 (≤ 256)."""
    return (query.device.type == "cpu" and query.shape[0] == 1 and key.dtype == torch.bfloat16
            and query.shape[-1] % 16 == 0 and query.shape[-1] <= 256 and available())


class RowLinear(torch.nn.Module):
    """An nn.Linear (bias-free, bf16, CPU) computed by `linear`; shares the original weight tensor."""

    def __init__(self, linear_module: torch.nn.Linear):
        super().__init__()
        self.weight = linear_module.weight  # contiguous: a freshly loaded (N, K) parameter
        if not self.weight.is_contiguous():
            self.weight.data = self.weight.data.contiguous()
        self.in_features, self.out_features = linear_module.in_features, linear_module.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)

    def to_linear(self) -> torch.nn.Linear:
        out = torch.nn.Linear(self.in_features, self.out_features, bias=False, device=self.weight.device,
                              dtype=self.weight.dtype)
        out.weight = self.weight
        return out


def swap_in(model: torch.nn.Module) -> int:
    """Replace every bias-free bf16 nn.Linear of `model` (the LM head included) by a RowLinear; returns how many."""
    count = 0
    for name, child in model.named_children():
        if isinstance(child, torch.nn.Linear) and child.bias is None and child.weight.dtype == torch.bfloat16:
            setattr(model, name, RowLinear(child))
            count += 1
        else:
            count += swap_in(child)
    return count


def swap_out(model: torch.nn.Module) -> None:
    """Back to nn.Linear (the int8 copy quantizes nn.Linear modules)."""
    for name, child in model.named_children():
        if isinstance(child, RowLinear):
            setattr(model, name, child.to_linear())
        else:
            swap_out(child)
