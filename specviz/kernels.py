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

/* Row-wise attention over a bf16 KV cache. q (R, H, D) fp32 query rows; k, v: one sequence's cache, key/value
   head j at k + j*hs, position p at + p*D. Row r sees the cache positions idx[off[r] .. off[r+1]), in order.
   Query head h reads key/value head h / (H / KVH). out (R, H, D) fp32 = softmax(q . K^T * scale) . V.
   Each (row, head) is one thread's fixed sequence of operations, so its bits never depend on R. D % 8 == 0. */
void attend_bf16(const float *q, const uint16_t *k, const uint16_t *v, float *out, const int32_t *idx,
                 const int64_t *off, long R, long H, long KVH, long D, long hs, float scale, int threads) {
    long g = H / KVH, maxn = 1;
    for (long r = 0; r < R; ++r) if (off[r + 1] - off[r] > maxn) maxn = off[r + 1] - off[r];
    #pragma omp parallel num_threads(threads)
    {
        float *s = (float *)__builtin_malloc(maxn * sizeof(float));
        __m256 acc[32];
        #pragma omp for schedule(static)
        for (long t = 0; t < R * H; ++t) {
            long r = t / H, h = t % H, n = off[r + 1] - off[r];
            const float *qr = q + t * D;
            const uint16_t *kh = k + (h / g) * hs, *vh = v + (h / g) * hs;
            const int32_t *ix = idx + off[r];
            float m = -__builtin_inff();
            for (long j = 0; j < n; ++j) {
                const uint16_t *kr = kh + (long)ix[j] * D;
                __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();  /* two chains: D/8 FMAs in flight */
                for (long d = 0; d < D; d += 16) {
                    a = _mm256_fmadd_ps(load_bf16(kr + d), _mm256_loadu_ps(qr + d), a);
                    if (d + 8 < D) b = _mm256_fmadd_ps(load_bf16(kr + d + 8), _mm256_loadu_ps(qr + d + 8), b);
                }
                s[j] = hsum(_mm256_add_ps(a, b)) * scale;
                if (s[j] > m) m = s[j];
            }
            float sum = 0.f;
            for (long j = 0; j < n; ++j) { s[j] = __builtin_expf(s[j] - m); sum += s[j]; }
            for (long d = 0; d < D / 8; ++d) acc[d] = _mm256_setzero_ps();
            for (long j = 0; j < n; ++j) {
                const uint16_t *vr = vh + (long)ix[j] * D;
                __m256 p = _mm256_set1_ps(s[j]);
                for (long d = 0; d < D / 8; ++d) acc[d] = _mm256_fmadd_ps(p, load_bf16(vr + 8 * d), acc[d]);
            }
            __m256 inv = _mm256_set1_ps(1.f / sum);
            for (long d = 0; d < D / 8; ++d) _mm256_storeu_ps(out + t * D + 8 * d, _mm256_mul_ps(acc[d], inv));
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
    """Whether `attend` takes this call: one sequence, a bf16 cache on CPU, head size a multiple of 8 (≤ 256)."""
    return (query.device.type == "cpu" and query.shape[0] == 1 and key.dtype == torch.bfloat16
            and query.shape[-1] % 8 == 0 and query.shape[-1] <= 256 and available())


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
