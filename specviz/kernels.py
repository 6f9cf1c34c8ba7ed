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

#define PASS(R) static void pass##R(const float *x, const uint16_t *w, float *y, long K, long N, long n0, long n1) { \
    for (long n = n0; n < n1; ++n) {                                                   \
        const uint16_t *wr = w + n * K;                                                \
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
            y[r * N + n] = s;                                                          \
        }                                                                              \
    }                                                                                  \
}
PASS(1) PASS(2) PASS(3) PASS(4) PASS(5) PASS(6) PASS(7) PASS(8)

/* y (M, N) fp32 = x (M, K) fp32 . w (N, K) bf16 ^T, output columns split over `threads` OpenMP threads */
void linear_bf16(const float *x, const uint16_t *w, float *y, long M, long K, long N, int threads) {
    for (long m0 = 0; m0 < M; m0 += 8) {
        long rows = M - m0 < 8 ? M - m0 : 8;
        const float *xs = x + m0 * K;
        float *ys = y + m0 * N;
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (long t = 0; t < threads; ++t) {
            long n0 = N * t / threads, n1 = N * (t + 1) / threads;
            switch (rows) {
                case 1: pass1(xs, w, ys, K, N, n0, n1); break;
                case 2: pass2(xs, w, ys, K, N, n0, n1); break;
                case 3: pass3(xs, w, ys, K, N, n0, n1); break;
                case 4: pass4(xs, w, ys, K, N, n0, n1); break;
                case 5: pass5(xs, w, ys, K, N, n0, n1); break;
                case 6: pass6(xs, w, ys, K, N, n0, n1); break;
                case 7: pass7(xs, w, ys, K, N, n0, n1); break;
                default: pass8(xs, w, ys, K, N, n0, n1); break;
            }
        }
    }
}
"""

_lib = None
_tried = False
_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (x86 "flags", Arm "Features"); empty where unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((l for l in text.splitlines() if l.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


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
            subprocess.run([cc, "-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-shared", str(src), "-o", str(tmp)],
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


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (..., K) bf16 · weight (N, K) bf16 ^T -> (..., N) bf16, each row computed on its own."""
    rows = x.reshape(-1, x.shape[-1]).float().contiguous()  # (M, K)
    weight = weight.contiguous()
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=torch.float32)  # (M, N)
    _lib.linear_bf16(rows.data_ptr(), weight.data_ptr(), out.data_ptr(), rows.shape[0], rows.shape[1],
                     weight.shape[0], torch.get_num_threads())
    return out.to(torch.bfloat16).reshape(*x.shape[:-1], weight.shape[0])


class RowLinear(torch.nn.Module):
    """An nn.Linear (bias-free, bf16, CPU) computed by `linear`; shares the original weight tensor."""

    def __init__(self, linear_module: torch.nn.Linear):
        super().__init__()
        self.weight = linear_module.weight
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
