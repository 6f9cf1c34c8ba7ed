"""The fused decoder: a Llama-architecture target's forward in one C call, for bf16 on CPU (the bitwise engine).

Why: a bf16 AR step streams every weight once (269 MB for the default target), so the read bandwidth bounds it, but
the stock transformers decoder ran far below that bound: torch's bf16 matmuls read the weights slowly for one or two
rows, and Python dispatch, small ops and the DynamicCache's per-step concatenation took a large share of each step
(experiments/probes/ar_step_profile.py measures both; the figures: docs/performance.md). Here every Linear reads its
weights packed once at load (kernels/packed_linear.c: 16 output rows by 2 input columns, contiguous), the layers run
in one parallel region (kernels/llama.c) over a preallocated KV cache (KVBuffer), and only the embedding lookup, the
final norm and the LM head are separate calls.

Exactness: each row's bits depend only on the row, its position and the keys it sees (the packed matmul and every
elementwise step take one fixed sequence of operations per row; attention is attend.c's), so verification of k
drafts gives one-token decoding's logits bit for bit, with no padding row and no 32-row limit. The bits are this
decoder's own, close to the stock model's (the same bf16 rounding points; other summation orders): CachedLM runs
every forward of a run through it, or none.

It serves targets whose loader picked row-wise attention (bf16 on CPU) and whose layers are Llama's: RMSNorm, rope
(default, linear or llama3 scaling), q/k/v/o and a SiLU gate/up/down MLP without biases, head size a multiple of 16.
SPECVIZ_FUSED=0 keeps the stock decoder (the probes compare both). Elsewhere (GPU, fp32, other architectures, no C
compiler) CachedLM runs the stock decoder as before.
"""
from __future__ import annotations

import collections.abc
import contextlib
import ctypes
import functools
import os

import torch

from specviz.models import attention, kernels

ROPE_TYPES = ("default", "linear", "llama3")  # position-independent tables: computed once per position
STORE_BF16, ADD_BF16, STORE_F32 = 0, 1, 2      # packed.h's output modes


def _typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` (a kernels build) with the argument types of the functions used here."""
    long, ptr = ctypes.c_long, ctypes.c_void_p
    lib.pack_bf16.argtypes = [ptr, ptr, long, long, ctypes.c_int]
    lib.linear_packed.argtypes = [ptr, ptr, ptr, long, long, long, ctypes.c_int, ctypes.c_int]
    lib.rmsnorm_rows.argtypes = [ptr, ptr, ptr, long, long, ctypes.c_float]
    lib.llama_layers.argtypes = ([ptr, long, ptr, long, ptr, ptr, ptr, ptr, long, ptr, ptr, ptr, long, long, long, ptr]
                                 + [long] * 5 + [ctypes.c_float, ctypes.c_float, ctypes.c_int])
    lib.eagle3_step.argtypes = ([ptr, long, ptr, ptr, long, ptr, long, ptr, ptr, ptr, ptr, ptr, long, ptr, ptr]
                                + [long] * 5 + [ctypes.c_float, ctypes.c_float, ctypes.c_int])
    lib.eagle3_context.argtypes = ([ptr, long, ptr, ptr, ptr, long, long, ptr, ptr, ptr, ptr, ptr, long] + [long] * 5
                                   + [ctypes.c_float, ctypes.c_float, ptr, ptr, long, ptr, ctypes.c_int])
    lib.dflash_context.argtypes = ([ptr, long, long, long, ptr, ptr, ptr, ptr, long, long, long, long, long]
                                   + [ctypes.c_float, ctypes.c_int])
    lib.dflash_block.argtypes = ([ptr, ptr, long, long, ptr, ptr, ptr, ptr, long, long, ptr] + [long] * 5
                                 + [ctypes.c_float, ctypes.c_float, ptr, ptr, long, ptr, ctypes.c_int])
    for f in (lib.pack_bf16, lib.linear_packed, lib.rmsnorm_rows, lib.llama_layers, lib.eagle3_step,
              lib.eagle3_context, lib.dflash_context, lib.dflash_block):
        f.restype = None
    return lib


@functools.lru_cache(maxsize=1)
def _default() -> ctypes.CDLL:
    """The kernels build `kernels.available()` loaded, typed."""
    return _typed(kernels.library(kernels.best_isa()))


_build: list[ctypes.CDLL] = []  # the builds run_on() put in place, innermost last


def _lib() -> ctypes.CDLL:
    return _build[-1] if _build else _default()


def load_build(path) -> ctypes.CDLL:
    """Another build of the kernels (a library kernels.compile_command made, say with other -D flags), typed for the
    calls here: for run_on."""
    return _typed(ctypes.CDLL(str(path)))


@contextlib.contextmanager
def run_on(build: ctypes.CDLL):
    """Inside the block, every call here (the fused layers, packed matmuls, norms) runs on `build` (load_build): the
    probes time kernel variants in one process."""
    _build.append(build)
    try:
        yield build
    finally:
        _build.pop()


def supports(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the fused decoder can run `model` here (see the module's docstring)."""
    if os.environ.get("SPECVIZ_FUSED") == "0" or device.type != "cpu" or dtype != torch.bfloat16:
        return False
    cfg = model.config
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
        layers = decoder.layers
        attn, mlp = layers[0].self_attn, layers[0].mlp
        shapes_ok = (cfg.hidden_size % 16 == 0 and attn.head_dim % 16 == 0 and attn.head_dim <= 256
                     and cfg.intermediate_size % 16 == 0 and cfg.num_attention_heads % cfg.num_key_value_heads == 0)
        plain = (getattr(cfg, "model_type", "") == "llama" and not getattr(cfg, "attention_bias", False)
                 and not getattr(cfg, "mlp_bias", False) and cfg.hidden_act == "silu"
                 and getattr(cfg, "pretraining_tp", 1) == 1 and head is not None and getattr(head, "bias", None) is None
                 and decoder.rotary_emb.rope_type in ROPE_TYPES and mlp.gate_proj.weight.dtype == torch.bfloat16
                 and len(layers) == cfg.num_hidden_layers)
    except (AttributeError, TypeError, IndexError):
        return False
    return (shapes_ok and plain and cfg._attn_implementation == attention.NAME and kernels.available())


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A (N, K) bf16 weight in packed_linear.c's layout: blocks of 16 rows, pairs of columns interleaved."""
    weight = weight.detach().to(torch.bfloat16).contiguous()
    n, k = weight.shape
    out = torch.empty(-(-n // 16) * 16 * k, dtype=torch.bfloat16)
    _lib().pack_bf16(weight.data_ptr(), out.data_ptr(), n, k, kernels.threads())
    return out


def linear_packed(x: torch.Tensor, packed: torch.Tensor, n: int, store: int = STORE_BF16) -> torch.Tensor:
    """x (r, K) bf16 times a weight of N rows in pack()'s layout -> (r, N), bf16 (STORE_BF16) or float32
    (STORE_F32): one row-invariant packed matmul, as the fused decoder runs every Linear."""
    x = x.to(torch.bfloat16).contiguous()
    out = torch.empty(x.shape[0], n, dtype=torch.float32 if store == STORE_F32 else torch.bfloat16)
    _lib().linear_packed(x.data_ptr(), packed.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], n, store,
                         kernels.threads())
    return out


def rmsnorm(rows: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of rows (r, d) with a bf16 weight (d,) in one C call (llama.c's rmsnorm_rows, the layers' norm): bf16."""
    rows = rows.to(torch.bfloat16).contiguous()
    out = torch.empty_like(rows)
    _lib().rmsnorm_rows(rows.data_ptr(), weight.data_ptr(), out.data_ptr(), rows.shape[0], rows.shape[1], eps)
    return out


class PackedLinear(kernels.RowLinear):
    """An nn.Linear (bf16, CPU) on the packed matmul: its weight packed once (pack), each call one linear_packed,
    the bias (if any) added to the rounded product. The one-layer drafters' Linears (drafters.trained.load): their
    calls are a few rows through small weights, where the packed pass is faster than kernels.linear (measured at a
    drafter's shapes by experiments/probes/probe_drafter_matmuls.py: docs/performance.md). Row-invariant like every
    kernel here; its bits are the packed matmul's, not the row kernel's (drafts only propose)."""

    def __init__(self, linear_module: torch.nn.Linear):
        super().__init__(linear_module)
        self.packed = pack(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = linear_packed(x.reshape(-1, self.in_features), self.packed, self.out_features)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


class KVBuffer:
    """One run's keys and values for every layer, preallocated: keys and values (layers, kv heads, capacity, head
    dim) bf16, grown by doubling. How many positions are valid is its owner's count (CachedLM.seen): a rejected
    draft's slots are simply written over."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int = 512):
        self.keys = torch.empty(layers, kv_heads, capacity, head_dim, dtype=torch.bfloat16)
        self.values = torch.empty_like(self.keys)
        self._pointers()

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def _pointers(self) -> None:
        layers = self.keys.shape[0]
        self.table = torch.tensor([[self.keys[i].data_ptr(), self.values[i].data_ptr()] for i in range(layers)],
                                  dtype=torch.int64)  # (layers, 2) addresses for llama_layers

    def ensure(self, positions: int) -> None:
        """Room for `positions` slots (doubling; the slots held are copied)."""
        if positions <= self.capacity:
            return
        capacity = self.capacity
        while capacity < positions:
            capacity *= 2
        keys = torch.empty(*self.keys.shape[:2], capacity, self.keys.shape[3], dtype=torch.bfloat16)
        values = torch.empty_like(keys)
        keys[:, :, :self.capacity] = self.keys
        values[:, :, :self.capacity] = self.values
        self.keys, self.values = keys, values
        self._pointers()

    @torch.inference_mode()
    def keep(self, positions: list[int]) -> None:
        """Keep the slots `positions` (increasing: the committed context, then a tree's accepted path) as slots
        0 .. len - 1: the rows that move are written over the first dropped ones."""
        first = next((k for k, p in enumerate(positions) if p != k), len(positions))
        if first < len(positions):
            index = torch.tensor(positions[first:], dtype=torch.long)
            self.keys[:, :, first:len(positions)] = self.keys.index_select(2, index)
            self.values[:, :, first:len(positions)] = self.values.index_select(2, index)


class FusedLlama:
    """A Llama model's weights packed for llama_layers (built once per loaded model, read-only, shared by runs)."""

    def __init__(self, model: torch.nn.Module):
        cfg, decoder = model.config, model.get_decoder()
        attn = decoder.layers[0].self_attn
        self.n_layers, self.d, self.head_dim = len(decoder.layers), cfg.hidden_size, attn.head_dim
        self.heads, self.kv_heads, self.ffn = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
        self.eps, self.scale = float(decoder.norm.variance_epsilon), float(attn.scaling)
        self.embedding = decoder.embed_tokens.weight              # (V, d)
        self.final_norm = decoder.norm.weight.detach().contiguous()  # (d,)
        self.rotary = decoder.rotary_emb
        self._keep, rows = [], []
        for layer in decoder.layers:
            a, m = layer.self_attn, layer.mlp
            parts = [layer.input_layernorm.weight.detach().contiguous(),
                     pack(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),  # ((H + 2 KVH) hd, d)
                     pack(a.o_proj.weight),                                                  # (d, H hd)
                     layer.post_attention_layernorm.weight.detach().contiguous(),
                     pack(torch.cat([m.gate_proj.weight, m.up_proj.weight])),                # (2 F, d)
                     pack(m.down_proj.weight)]                                               # (d, F)
            self._keep += parts
            rows.append([p.data_ptr() for p in parts])
        self.weights = torch.tensor(rows, dtype=torch.int64)       # (layers, 6) addresses
        self.head_weight = model.get_output_embeddings().weight
        self.vocab = self.head_weight.shape[0]
        self.head_packed = pack(self.head_weight)                 # (V, d) packed
        self.rope = (torch.empty(0, self.head_dim, dtype=torch.bfloat16),) * 2  # (cos, sin), replaced whole

    def new_cache(self) -> KVBuffer:
        return KVBuffer(self.n_layers, self.kv_heads, self.head_dim)

    def _rope_upto(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables (at least `positions`, head dim) bf16 from the model's own rotary embedding (the stock
        bits), grown by doubling."""
        rope = self.rope
        if positions > rope[0].shape[0]:
            size = max(1024, 1 << (positions - 1).bit_length())
            cos, sin = self.rotary(self.embedding[:1], position_ids=torch.arange(size)[None])  # (1, size, hd) each
            rope = self.rope = (cos[0].contiguous(), sin[0].contiguous())
        return rope

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (n,) -> (n, d) bf16."""
        return torch.nn.functional.embedding(ids, self.embedding)

    @torch.inference_mode()
    def layers(self, cache: KVBuffer, hidden: torch.Tensor, start: int, positions: torch.Tensor | None = None,
               mask: torch.Tensor | attention.Visible | None = None, layers: range | None = None,
               states: bool = False):
        """Run `layers` (all by default) over hidden (n, d) bf16, whose rows go to cache slots start .. start + n - 1
        at `positions` (n,) (default: their slots), attending causally or as the bool mask (1, 1, n, start + n)
        allows (or as an attention.Visible says: a tree's rows, trees.tree_visible). Returns (hidden after the last
        layer (n, d), each layer's output (len(layers), n, d) or None)."""
        hidden = hidden.to(torch.bfloat16).contiguous().clone()  # (n, d), updated in place by the C code
        n = hidden.shape[0]
        layers = range(self.n_layers) if layers is None else layers
        cache.ensure(start + n)
        cos, sin = self._rope_upto(start + n + 1)
        index = offsets = lead = None
        base = 0
        if isinstance(mask, attention.Visible):  # a tree's rows: C spells out their slots
            lead, index, offsets, base = mask
        elif mask is not None:
            index, offsets = attention.visible_index(mask, n, start + n)
        if positions is not None:
            positions = positions.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty(len(layers), n, self.d, dtype=torch.bfloat16) if states else None
        ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
        _lib().llama_layers(hidden.data_ptr(), n, ptr(positions), start, cos.data_ptr(), sin.data_ptr(),
                            self.weights.data_ptr(), cache.table.data_ptr(), cache.capacity, ptr(index), ptr(offsets),
                            ptr(lead), base, layers.start, layers.stop, ptr(out), self.d, self.head_dim, self.heads,
                            self.kv_heads, self.ffn, self.eps, self.scale, kernels.threads())
        return hidden, out

    def matmuls(self, layer: int) -> list[tuple[torch.Tensor, int, int]]:
        """Layer `layer`'s four packed matmuls as the C layers run them, each (packed weight, outputs N, inputs K):
        QKV, O, gate+up, down (for linear_packed; the probes time them alone)."""
        _, qkv, o, _, gate_up, down = self._keep[6 * layer:6 * layer + 6]  # the norms' weights between
        qd = self.heads * self.head_dim
        return [(qkv, qd + 2 * self.kv_heads * self.head_dim, self.d), (o, self.d, qd),
                (gate_up, 2 * self.ffn, self.d), (down, self.d, self.ffn)]

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final RMSNorm of rows (r, d) bf16."""
        return rmsnorm(hidden, self.final_norm, self.eps)

    def head(self, rows: torch.Tensor) -> torch.Tensor:
        """The LM head on final-norm rows (r, d) bf16 -> logits (r, V) float32 (bf16 values, as the stock head's)."""
        return linear_packed(rows, self.head_packed, self.vocab, STORE_F32)

    def decode(self, cache: KVBuffer, ids: torch.Tensor, start: int, mask: torch.Tensor | None = None,
               positions: torch.Tensor | None = None, hidden_states: bool = False):
        """The decoder over ids (n,) fed at slots start..: (final-norm hidden (n, d), and with hidden_states the
        tuple transformers returns: the embeddings, each layer's output, the last replaced by the final-norm one,
        each (1, n, d))."""
        embedded = self.embed(ids)
        hidden, out = self.layers(cache, embedded, start, positions, mask, states=hidden_states)
        last = self.norm(hidden)
        return last, HiddenStates(embedded, out, last) if hidden_states else None


class HiddenStates(collections.abc.Sequence):
    """The tuple transformers returns as hidden_states (the embeddings, each layer's output, the last replaced by the
    final-norm one, each (1, n, d)), each item made when asked for: a reader of EAGLE-3's three layers takes three
    views, not one per layer each step."""

    def __init__(self, embedded: torch.Tensor, layers: torch.Tensor, last: torch.Tensor):
        self.embedded, self.layers, self.last = embedded, layers, last

    def __len__(self) -> int:
        return len(self.layers) + 1

    def __getitem__(self, i: int) -> torch.Tensor:
        i = i + len(self) if i < 0 else i
        if not 0 <= i < len(self):
            raise IndexError(f"hidden state {i} of {len(self)}")
        return (self.embedded if i == 0 else self.last if i == len(self) - 1 else self.layers[i - 1])[None]


class FusedEagle3:
    """An EAGLE-3 drafter's step (drafters.modules.Eagle3: fc over the target's fused features and its one layer)
    in one C call (llama.c's eagle3_step), over a KVBuffer of one layer, its weights packed once: what the torch
    module computes, with its rounding points on the packed matmul, and attend.c's attention. Its readout (a norm)
    is one more call; the draft head (a packed matmul) and the warp stay in torch. Drafts only propose:
    verification stays exact."""

    def __init__(self, module: torch.nn.Module, rotary):
        layer, attn = module.midlayer, module.midlayer.self_attn
        self.d, self.head_dim, self.heads, self.kv_heads = module.fc.out_features, attn.hd, attn.h, attn.kv
        self.nf, self.ffn = module.fc.in_features, layer.mlp.gate_proj.out_features
        self.eps, self.scale = float(module.norm.eps), attn.hd ** -0.5
        self.rotary = rotary  # positions (T,) -> the module's (cos, sin) tables (T, hd), bf16
        bf16 = lambda t: t.detach().to(torch.bfloat16).contiguous()  # noqa: E731
        fc_bias = getattr(module.fc, "bias", None)
        self._keep = [pack(module.fc.weight), None if fc_bias is None else bf16(fc_bias),
                      bf16(layer.input_layernorm.weight), bf16(layer.hidden_norm.weight),
                      pack(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])),
                      pack(attn.o_proj.weight), bf16(layer.post_attention_layernorm.weight),
                      pack(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])),
                      pack(layer.mlp.down_proj.weight)]
        self.weights = torch.tensor([0 if t is None else t.data_ptr() for t in self._keep], dtype=torch.int64)
        self.final_norm = bf16(module.norm.weight)
        self.rope = (torch.empty(0, self.head_dim, dtype=torch.bfloat16),) * 2

    def readout(self, rows: torch.Tensor) -> torch.Tensor:
        """The module's readout (its final norm, Eagle3.readout) of outputs (r, d), bf16: one C call."""
        return rmsnorm(rows, self.final_norm, self.eps)

    def new_cache(self) -> KVBuffer:
        return KVBuffer(1, self.kv_heads, self.head_dim)

    def _rope_upto(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The module's rotary tables (bf16) for positions 0 .. at least `positions`, grown by doubling."""
        if positions > self.rope[0].shape[0]:
            size = max(1024, 1 << (positions - 1).bit_length())
            self.rope = tuple(t.to(torch.bfloat16).contiguous() for t in self.rotary(torch.arange(size)))
        return self.rope

    @torch.inference_mode()
    def step(self, cache: KVBuffer, embeds: torch.Tensor, start: int, positions: torch.Tensor,
             feats: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        """n rows (embeds (n, d) of their tokens, positions (n,) their rope positions) into cache slots start ..,
        from the target's features `feats` (n, nf) (lifted by fc) or the previous step's outputs `hidden` (n, d);
        attending causally, or as the bool mask (n, start + n) allows. Returns their outputs (n, d) bf16: the
        predicted features the draft head reads (through the module's readout) and the next step's inputs."""
        n = embeds.shape[0]
        cache.ensure(start + n)
        cos, sin = self._rope_upto(int(positions.max()) + 1)
        out = (torch.empty(n, self.d, dtype=torch.bfloat16) if hidden is None
               else hidden.to(torch.bfloat16).contiguous().clone())
        embeds = embeds.to(torch.bfloat16).contiguous()
        feats = None if feats is None else feats.to(torch.bfloat16).contiguous()
        positions = positions.reshape(-1).to(torch.int64).contiguous()
        index = offsets = None
        if mask is not None:
            index, offsets = attention.visible_index(mask[None, None], n, start + n)
        ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
        _lib().eagle3_step(ptr(feats), self.nf, out.data_ptr(), embeds.data_ptr(), n,
                           positions.data_ptr(), start, cos.data_ptr(), sin.data_ptr(), self.weights.data_ptr(),
                           cache.keys.data_ptr(), cache.values.data_ptr(), cache.capacity, ptr(index), ptr(offsets),
                           self.d, self.head_dim, self.heads, self.kv_heads, self.ffn, self.eps, self.scale,
                           kernels.threads())
        return out

    @torch.inference_mode()
    def context(self, cache: KVBuffer, table: torch.Tensor, tokens: list[int], feats: torch.Tensor, start: int,
                head: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`step` over the target's features feats (n, nf) bf16 with the embeddings of `tokens` (rows of `table`, the
        target's bf16 embeddings) at positions start .. start + n - 1, causal, then the readout of the last row and the
        draft head (packed by `pack`, n_head rows) over it: one C call, the bits of step, readout and linear_packed
        (tests/test_drafters.py). Returns the rows' outputs (n, d) bf16 and the last row's draft logits (n_head,)
        float32. A step right after the target's forward pays tens of microseconds for every torch call it makes
        (experiments/LOG.md), so this one makes two."""
        n = len(tokens)
        cache.ensure(start + n)
        cos, sin = self._rope_upto(start + n)
        out = torch.empty(n, self.d, dtype=torch.bfloat16)
        logits = torch.empty(n_head, dtype=torch.float32)
        ids = (ctypes.c_int64 * n)(*tokens)
        _lib().eagle3_context(feats.data_ptr(), self.nf, out.data_ptr(), table.data_ptr(), ctypes.addressof(ids), n,
                              start, cos.data_ptr(), sin.data_ptr(), self.weights.data_ptr(), cache.keys.data_ptr(),
                              cache.values.data_ptr(), cache.capacity, self.d, self.head_dim, self.heads,
                              self.kv_heads, self.ffn, self.eps, self.scale, self.final_norm.data_ptr(),
                              head.data_ptr(), n_head, logits.data_ptr(), kernels.threads())
        return out, logits


class FusedDFlash:
    """A DFlash drafter (drafters.dflash.DFlash) in two C calls a step (llama.c): its context's new rows (fc,
    hidden_norm, each layer's keys and values: dflash_context) and the block (its layers over the committed token and
    the masks, its norm and the packed draft head: dflash_block), over a KVBuffer of its layers whose first slots
    hold the context and whose next ones the block, its weights packed once. What the torch module computes, with
    its rounding points on the packed matmul and attend.c's attention (not torch's: the logits differ in their last
    bits, tests/test_dflash.py). Drafts only propose: verification stays exact."""

    def __init__(self, module: torch.nn.Module, rotary):
        first = module.layers[0].self_attn
        self.d, self.head_dim, self.heads, self.kv_heads = module.fc.out_features, first.hd, first.h, first.kv
        self.nf, self.ffn = module.fc.in_features, module.layers[0].mlp.gate_proj.out_features
        self.n_layers, self.eps, self.scale = len(module.layers), float(module.norm.eps), first.hd ** -0.5
        self.rotary = rotary  # positions (T,) -> the module's (cos, sin) tables (T, hd), bf16
        bf16 = lambda t: t.detach().to(torch.bfloat16).contiguous()  # noqa: E731
        context, block = [pack(module.fc.weight), bf16(module.hidden_norm.weight)], []
        for layer in module.layers:
            a, m = layer.self_attn, layer.mlp
            context += [pack(torch.cat([a.k_proj.weight, a.v_proj.weight])), bf16(a.k_norm.weight)]
            block += [bf16(layer.input_layernorm.weight), pack(torch.cat([a.q_proj.weight, a.k_proj.weight,
                                                                           a.v_proj.weight])),
                      pack(a.o_proj.weight), bf16(layer.post_attention_layernorm.weight),
                      pack(torch.cat([m.gate_proj.weight, m.up_proj.weight])), pack(m.down_proj.weight),
                      bf16(a.q_norm.weight), bf16(a.k_norm.weight)]
        self._keep = context + block  # the tensors the addresses below point into
        self.context_weights = torch.tensor([t.data_ptr() for t in context], dtype=torch.int64)
        self.block_weights = torch.tensor([t.data_ptr() for t in block], dtype=torch.int64)
        self.final_norm = bf16(module.norm.weight)
        self.rope = (torch.empty(0, self.head_dim, dtype=torch.bfloat16),) * 2

    def readout(self, rows: torch.Tensor) -> torch.Tensor:
        return rows  # the module's outputs are already normed (DFlash.readout)

    def new_cache(self) -> KVBuffer:
        return KVBuffer(self.n_layers, self.kv_heads, self.head_dim)

    _rope_upto = FusedEagle3._rope_upto

    @torch.inference_mode()
    def context(self, cache: KVBuffer, feats: torch.Tensor, start: int) -> None:
        """The target's fused states feats (n, nf) at positions start .. start + n - 1 into every layer's context
        (cache slots start ..)."""
        n = feats.shape[0]
        cache.ensure(start + n)
        cos, sin = self._rope_upto(start + n)
        feats = feats.to(torch.bfloat16).contiguous()
        _lib().dflash_context(feats.data_ptr(), self.nf, n, start, cos.data_ptr(), sin.data_ptr(),
                              self.context_weights.data_ptr(), cache.table.data_ptr(), cache.capacity, self.n_layers,
                              self.d, self.head_dim, self.kv_heads, self.eps, kernels.threads())

    @torch.inference_mode()
    def block(self, cache: KVBuffer, table: torch.Tensor, ids: list[int], start: int, head: torch.Tensor,
              n_head: int) -> torch.Tensor:
        """The block of `ids` (the committed token, then the masks; embeddings: rows of `table`, the target's bf16
        embeddings) at positions and cache slots start .., over the context in slots 0 .. start - 1: the draft
        logits (len(ids) - 1, n_head) float32 of the slots after the first, through the packed head `head`."""
        n = len(ids)
        cache.ensure(start + n)
        cos, sin = self._rope_upto(start + n)
        hidden = torch.empty(n, self.d, dtype=torch.bfloat16)
        logits = torch.empty(n - 1, n_head, dtype=torch.float32)
        idx = (ctypes.c_int64 * n)(*ids)
        _lib().dflash_block(table.data_ptr(), ctypes.addressof(idx), n, start, cos.data_ptr(), sin.data_ptr(),
                            self.block_weights.data_ptr(), cache.table.data_ptr(), cache.capacity, self.n_layers,
                            hidden.data_ptr(), self.d, self.head_dim, self.heads, self.kv_heads, self.ffn, self.eps,
                            self.scale, self.final_norm.data_ptr(), head.data_ptr(), n_head, logits.data_ptr(),
                            kernels.threads())
        return logits


def build(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> FusedLlama | None:
    """The fused decoder for `model` where `supports` says it runs here, else None."""
    return FusedLlama(model) if supports(model, device, dtype) else None
