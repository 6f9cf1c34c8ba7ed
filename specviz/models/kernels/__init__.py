"""A row-invariant bf16 matmul for CPUs without native bf16 (AVX2), compiled at first use.

Why: decode steps stream the weights, and bf16 halves them; but where the CPU has no bf16 instructions
torch emulates bf16 matmuls at about one row's cost per row (experiments/LOG.md), so verifying k tokens costs about
k steps and speculation cannot pay. This
kernel streams each weight row once for up to 8 activation rows: it widens bf16 to fp32 in registers
(a 16-bit shift), multiplies-adds with AVX2 FMA in fp32 and rounds the result to bf16. Each output is one
fixed sequence of operations over k, whatever the number of rows, so a row's bits never depend on the
other rows: verification stays bitwise one-token decoding with no padding row.

The same library holds the row-wise attention over a bf16 KV cache that every bf16 CPU forward uses (attend):
one fixed sequence of operations per (row, head), so a row's bits never depend on the other rows either.

The C lives beside this file: rowwise_linear.c (linear_bf16), attend.c (attend_bf16) and common.h, and the fused
decoder's (specviz/models/fused.py) packed_linear.c (pack_bf16, linear_packed), llama.c (llama_layers) and packed.h.
The .c files are compiled together once per content version with the system C compiler into a per-user cache
(about a second) and called through ctypes: for AVX2/FMA; for AVX-512 where the CPU has it, whose attention takes
16-lane registers and gives the AVX2 build's bits (faster: experiments/results/attend_ab_avx512.txt); and for
AVX512-BF16, whose packed matmul takes vdpbf16ps (its own bits), and whose attention scores bf16 queries with
vdpbf16ps (the other builds' bits: docs/performance.md). Where there is no compiler, or the CPU lacks AVX2/FMA,
`available()` is False and the stock torch kernels run (a Space's image without gcc, say): a failed build logs one
line saying why (logger "specviz.kernels"), and `describe()` names what runs here.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = ("rowwise_linear.c", "attend.c", "packed_linear.c", "llama.c")  # compiled together: one library per ISA
HEADERS = ("common.h", "packed.h")
log = logging.getLogger("specviz.kernels")

_lib = None
_isa: str | None = None  # the build `available()` loaded
_tried = False
_lock = threading.Lock()
_why: dict[str, str] = {}  # isa -> why its build is not there (a failed compile, a failed load)


@functools.lru_cache(maxsize=None)
def cpuinfo(*keys: str) -> str:
    """The value of the first /proc/cpuinfo line starting with one of `keys`; empty where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line for line in text.splitlines() if line.startswith(keys)), "").partition(":")[2].strip()


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (x86 "flags", Arm "Features"); empty where unreadable."""
    return frozenset(cpuinfo("flags", "Features").split())


# the instruction sets the sources are compiled for: the compiler flags and the CPU flags each needs. The attention
# kernel takes 16-lane registers under AVX-512 (bit-identical to its 8-lane AVX2 form); the matmul is the same code.
# The packed matmul (packed_linear.c) takes vdpbf16ps under AVX512-BF16 (its own bits), and gives the same bits in
# the AVX2 and AVX-512 builds.
ISAS = {"avx2": (("-mavx2", "-mfma"), {"avx2", "fma"}),
        "avx512": (("-mavx2", "-mfma", "-mavx512f"), {"avx2", "fma", "avx512f"}),
        "avx512bf16": (("-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"),
                       {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16"})}
ISA_NAMES = {"avx2": "AVX2/FMA", "avx512": "AVX-512", "avx512bf16": "AVX512-BF16"}
WARNINGS = ("-Wall", "-Wextra")  # diagnostics only: the code generated is the same without them


def best_isa() -> str | None:
    """The widest instruction set in ISAS this CPU has (SPECVIZ_KERNEL_ISA=avx2 keeps the AVX2 build); None where
    it lacks AVX2/FMA."""
    fit = [isa for isa, (_, needs) in ISAS.items() if needs <= cpu_flags()]
    asked = os.environ.get("SPECVIZ_KERNEL_ISA")
    return asked if asked in fit else (fit[-1] if fit else None)


def compile_command(isa: str, output: Path, folder: Path | None = None) -> list[str]:
    """The compiler call that builds `isa`'s library from the sources in `folder` (SOURCE_DIR) into `output`."""
    folder = SOURCE_DIR if folder is None else folder
    return [os.environ.get("CC", "cc"), "-O3", *ISAS[isa][0], *WARNINGS, "-fopenmp", "-fPIC", "-shared",
            *(str(folder / name) for name in SOURCES), "-o", str(output), "-lm"]


def _first_error(stderr: str, returncode: int) -> str:
    """The compiler's first error line (else its first line of output, else its exit status), paths shortened."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [e for e in lines if "error" in e.lower() and not e.startswith("collect2")]  # not the linker's summary
    line = errors[0] if errors else lines[0] if lines else f"exit status {returncode}"
    return line.replace(f"{SOURCE_DIR}{os.sep}", "")


def _give_up(isa: str, why: str) -> None:
    _why[isa] = why
    log.warning("specviz kernels: the %s build failed (%s); the slow torch path runs instead", ISA_NAMES[isa], why)


@functools.lru_cache(maxsize=None)
def library(isa: str) -> ctypes.CDLL | None:
    """The sources compiled for `isa` once per version (their contents and the compiler call) into ~/.cache/specviz
    (or a temp folder) and loaded; None where this CPU lacks the instruction set, or the build fails (logged once)."""
    flags, needs = ISAS[isa]
    if not needs <= cpu_flags():
        _why[isa] = f"this CPU lacks {'/'.join(sorted(needs - cpu_flags())).upper()}"
        return None
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        try:
            digest.update(f"{name}\0".encode() + (SOURCE_DIR / name).read_bytes() + b"\0")
        except OSError as error:  # an install that left the C out
            return _give_up(isa, f"cannot read {name}: {error.strerror or error}")
    digest.update("\0".join(compile_command(isa, Path("out"), Path("."))).encode())
    key = digest.hexdigest()[:16]
    folder = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specviz"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / "specviz-kernels"
        folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"kernels-{isa}-{key}.so"
    if not lib.exists():
        tmp = folder / f"kernels-{isa}-{key}.{os.getpid()}.so"
        command = compile_command(isa, tmp)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            return _give_up(isa, f"no C compiler found ({command[0]})")
        except (OSError, subprocess.SubprocessError) as error:
            return _give_up(isa, f"{command[0]}: {type(error).__name__}: {error}".splitlines()[0])
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            return _give_up(isa, _first_error(done.stderr, done.returncode))
        tmp.replace(lib)  # atomic: concurrent builders never load a half-written file
    try:
        handle = ctypes.CDLL(str(lib))
    except OSError as error:
        return _give_up(isa, f"cannot load {lib.name}: {error}".splitlines()[0])
    handle.linear_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                                   ctypes.c_long, ctypes.c_int]
    handle.linear_bf16.restype = None
    handle.attend_bf16.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_long] * 5 + [ctypes.c_float, ctypes.c_int]
    handle.attend_bf16.restype = None
    return handle


def available() -> bool:
    """Whether the kernel is compiled and loadable here (compiled on the first call)."""
    global _lib, _isa, _tried
    with _lock:
        if not _tried:
            _tried = True
            if os.environ.get("SPECVIZ_NO_KERNELS") != "1":
                _isa = best_isa()
                _lib = library(_isa) if _isa else None
        return _lib is not None


def describe() -> str:
    """One line naming the kernels that run here: 'C row kernels, AVX-512 build' or 'torch fallback: <why>'."""
    if available():
        return f"C row kernels, {ISA_NAMES.get(_isa, _isa)} build"
    if os.environ.get("SPECVIZ_NO_KERNELS") == "1":
        return "torch fallback: SPECVIZ_NO_KERNELS=1"
    if _isa is None:
        return "torch fallback: this CPU lacks AVX2/FMA"
    return f"torch fallback: {_why.get(_isa, 'the build is not there')}"


def threads() -> int:
    """The kernels' OpenMP threads: SPECVIZ_KERNEL_THREADS, else torch's. Their threads spin briefly at each
    call's end, so where another busy process shares the cores, one thread measures faster (docs/performance.md,
    "Shared cores")."""
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


def swap_in(model: torch.nn.Module, bias: bool = False, kind: type[RowLinear] = RowLinear) -> int:
    """Replace every bf16 nn.Linear of `model` (the LM head included) by a RowLinear (or `kind`, a subclass: the
    drafters' fused.PackedLinear): the bias-free ones, and with `bias` (a drafter's module) those with a bias too;
    returns how many."""
    count = 0
    for name, child in model.named_children():
        if (isinstance(child, torch.nn.Linear) and (bias or child.bias is None)
                and child.weight.dtype == torch.bfloat16):
            setattr(model, name, kind(child))
            count += 1
        else:
            count += swap_in(child, bias, kind)
    return count


def swap_out(model: torch.nn.Module) -> None:
    """Back to nn.Linear (the int8 copy quantizes nn.Linear modules)."""
    for name, child in model.named_children():
        if isinstance(child, RowLinear):
            setattr(model, name, child.to_linear())
        else:
            swap_out(child)
