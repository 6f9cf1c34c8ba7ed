"""What the pinned llama.cpp loads from and computes with an EAGLE-3 or DFlash drafter GGUF (gguf_spec.py writes
them), read back through gguf's own reader:

- `expected`: every tensor its loader creates (src/models/eagle3.cpp and dflash.cpp `load_arch_tensors`), with the
  shape it asks for in ggml's order (ne: the innermost dimension first), and the metadata keys it requires;
  `verify` names any tensor missing, unexpected or misshapen, and any key missing;
- `Graph`: the drafter's logits computed from the file's tensors and hyperparameters the way the pinned graphs
  compute them (eagle3.cpp `graph<false>`, dflash.cpp `graph<false>` with its KV injection): NORM (pairwise) rope
  for EAGLE-3 on its permuted q/k, NEOX (halves) rope for DFlash, the draft logits scattered through `d2t` into
  the target's vocabulary with -inf elsewhere;
- `check`: both, against specviz's own module on random inputs (both in fp64, so that only a real difference
  shows above the rounding).
"""
from __future__ import annotations

from pathlib import Path

from specviz.serving.export_common import TOLERANCE, ExportError

COMMON_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
               "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "target_layers")
ARCH_KEYS = {"eagle3": ("target_hidden_size",), "dflash": ("block_size",)}
QK_NORMS = {"eagle3": False, "dflash": True}  # the pinned graph's layers norm each head's queries and keys
OTHER_KEYS = {"eagle3": ("tokenizer.ggml.tokens",), "dflash": ("tokenizer.ggml.tokens", "tokenizer.ggml.mask_token_id")}


def expected(arch: str, cfg, n_draft: int, has_d2t: bool) -> dict[str, tuple[int, ...]]:
    """{tensor name: ne} the pinned loader creates for this drafter (the optional ones specviz writes included)."""
    d, f, h, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = d // h
    n_inp = len(cfg.feature_layers) * d
    out = {"fc.weight": (n_inp, d), "output_norm.weight": (d,), "output.weight": (d, n_draft)}
    if has_d2t:
        out["d2t"] = (n_draft,)
    if arch == "eagle3":
        layers, width = 1, 2 * d
        out.update({"blk.0.attn_norm_2.weight": (d,)})
    else:
        layers, width = cfg.num_hidden_layers, d
        out["enc.output_norm.weight"] = (d,)
    for i in range(layers):
        b = f"blk.{i}."
        out.update({b + "attn_norm.weight": (d,), b + "attn_q.weight": (width, hd * h),
                    b + "attn_k.weight": (width, hd * kv), b + "attn_v.weight": (width, hd * kv),
                    b + "attn_output.weight": (hd * h, d), b + "ffn_norm.weight": (d,), b + "ffn_gate.weight": (d, f),
                    b + "ffn_down.weight": (f, d), b + "ffn_up.weight": (d, f)})
        if QK_NORMS[arch]:
            out.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)})
    return out


def required_keys(arch: str) -> list[str]:
    return ([f"{arch}.{k}" for k in COMMON_KEYS + ARCH_KEYS[arch]] + list(OTHER_KEYS[arch])
            + ["general.architecture"])


def verify(reader, arch: str, cfg, n_draft: int, has_d2t: bool, path: Path) -> None:
    """ExportError (one line) naming what the pinned loader would refuse or not find."""
    import gguf

    want = expected(arch, cfg, n_draft, has_d2t)
    have = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    shapes = sorted(f"{k} {have[k]} (wants {want[k]})" for k in set(want) & set(have) if have[k] != want[k])
    keys = [k for k in required_keys(arch) if k not in reader.fields]
    if missing or extra or shapes or keys:
        parts = [f"missing tensors {missing}" if missing else "", f"tensors it does not load {extra}" if extra else "",
                 f"misshapen {shapes}" if shapes else "", f"missing keys {keys}" if keys else ""]
        raise ExportError(f"{path}: not the {arch} GGUF llama.cpp loads: " + "; ".join(p for p in parts if p))
    if reader.fields["general.architecture"].contents() != arch:
        raise ExportError(f"{path}: general.architecture is {reader.fields['general.architecture'].contents()!r}, "
                          f"not {arch!r}")
    for t in reader.tensors:
        kind = gguf.GGMLQuantizationType.I64 if t.name == "d2t" else gguf.GGMLQuantizationType.F32
        if t.tensor_type != kind:
            raise ExportError(f"{path}: tensor {t.name} is {t.tensor_type.name}, llama.cpp wants {kind.name}")
    layers = list(reader.fields[f"{arch}.target_layers"].contents())
    if arch == "eagle3" and len(layers) != 3:
        raise ExportError(f"{path}: eagle3.target_layers={layers}: llama.cpp's EAGLE-3 requires exactly 3")


class Graph:
    """A drafter GGUF's tensors and hyperparameters, and the logits the pinned llama.cpp graph computes from them."""

    def __init__(self, path: Path):
        import gguf
        import torch

        self.reader = reader = gguf.GGUFReader(str(path))
        self.arch = reader.fields["general.architecture"].contents()
        self.t = {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}
        key = lambda k: reader.fields[f"{self.arch}.{k}"].contents()  # noqa: E731
        self.heads, self.kv = int(key("attention.head_count")), int(key("attention.head_count_kv"))
        self.eps, self.theta = float(key("attention.layer_norm_rms_epsilon")), float(key("rope.freq_base"))
        self.n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
        self.mask = (int(reader.fields["tokenizer.ggml.mask_token_id"].contents())
                     if "tokenizer.ggml.mask_token_id" in reader.fields else None)
        self.block_size = int(key("block_size")) if f"{self.arch}.block_size" in reader.fields else None

    def w(self, name: str):
        return self.t[name].double()

    def rms(self, x, weight):
        return x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * weight

    def rope(self, x, pos, neox: bool):
        """ggml_rope_ext on x (T, heads, hd) at positions (T,): NORM rotates pairs (2i, 2i+1), NEOX (i, i + hd/2)."""
        import torch

        hd = x.shape[-1]
        inv = self.theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = pos.double()[:, None, None] * inv  # (T, 1, hd/2)
        cos, sin = ang.cos(), ang.sin()
        if neox:
            a, b = x[..., : hd // 2], x[..., hd // 2:]
            return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(x.shape)

    def attend(self, q, k, v, causal: bool):
        """softmax(q k^T / sqrt(hd)) v, q (T, H, hd), k/v (S, KV, hd); a query head h reads kv head h // (H/KV)."""
        import torch

        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = torch.einsum("thd,shd->hts", q, k) / q.shape[-1] ** 0.5
        if causal:
            s = s.masked_fill(torch.ones(s.shape[1:], dtype=torch.bool).triu(1), float("-inf"))
        return torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(q.shape[0], -1)

    def ffn(self, x, b: str):
        import torch.nn.functional as F

        return (F.silu(x @ self.w(b + "ffn_gate.weight").T) * (x @ self.w(b + "ffn_up.weight").T)) \
            @ self.w(b + "ffn_down.weight").T

    def logits(self, h):
        """output_norm, output, and (with d2t) the scatter into the target's vocabulary, -inf elsewhere."""
        import torch

        draft = self.rms(h, self.w("output_norm.weight")) @ self.w("output.weight").T
        if "d2t" not in self.t:
            return draft
        full = torch.full((h.shape[0], self.n_vocab), float("-inf"), dtype=draft.dtype)
        full[:, self.t["d2t"].long()] = draft
        return full

    def heads_of(self, x, n):
        return x.reshape(x.shape[0], n, -1)

    def eagle3(self, feats, embeds, pos):
        """eagle3.cpp: the encoder (fc) then the decoder over (embedding, g) at positions pos, causal."""
        import torch

        g = feats @ self.w("fc.weight").T
        b = "blk.0."
        x = torch.cat([self.rms(embeds, self.w(b + "attn_norm.weight")),
                       self.rms(g, self.w(b + "attn_norm_2.weight"))], -1)
        q = self.rope(self.heads_of(x @ self.w(b + "attn_q.weight").T, self.heads), pos, neox=False)
        k = self.rope(self.heads_of(x @ self.w(b + "attn_k.weight").T, self.kv), pos, neox=False)
        v = self.heads_of(x @ self.w(b + "attn_v.weight").T, self.kv)
        ffn_inp = self.attend(q, k, v, causal=True) @ self.w(b + "attn_output.weight").T + g
        out = self.ffn(self.rms(ffn_inp, self.w(b + "ffn_norm.weight")), b) + ffn_inp
        return self.logits(out)

    def dflash(self, feats, embeds, pos_ctx, pos_block):
        """dflash.cpp: the context rows injected as every layer's keys and values, then the block, non-causal."""
        import torch

        ctx = self.rms(feats @ self.w("fc.weight").T, self.w("enc.output_norm.weight"))
        x, i = embeds, 0
        while f"blk.{i}.attn_norm.weight" in self.t:
            b = f"blk.{i}."
            kn, qn = self.w(b + "attn_k_norm.weight"), self.w(b + "attn_q_norm.weight")
            kc = self.rope(self.rms(self.heads_of(ctx @ self.w(b + "attn_k.weight").T, self.kv), kn), pos_ctx, True)
            vc = self.heads_of(ctx @ self.w(b + "attn_v.weight").T, self.kv)
            n = self.rms(x, self.w(b + "attn_norm.weight"))
            q = self.rope(self.rms(self.heads_of(n @ self.w(b + "attn_q.weight").T, self.heads), qn), pos_block, True)
            k = self.rope(self.rms(self.heads_of(n @ self.w(b + "attn_k.weight").T, self.kv), kn), pos_block, True)
            v = self.heads_of(n @ self.w(b + "attn_v.weight").T, self.kv)
            a = self.attend(q, torch.cat([kc, k]), torch.cat([vc, v]), causal=False)
            x = a @ self.w(b + "attn_output.weight").T + x
            x = self.ffn(self.rms(x, self.w(b + "ffn_norm.weight")), b) + x
            i += 1
        return self.logits(x)


def _specviz_module(cfg, state: dict):
    from specviz.drafters import trained
    from specviz.drafters.modules import load_into

    module = trained.build_module(cfg).double().eval()
    load_into(module, {k: v for k, v in state.items() if k != "vocab_ids"}, "drafter")
    return module


def check(arch: str, cfg, state: dict, embed, path: Path, rows: int = 64) -> dict:
    """The file as llama.cpp loads it (`verify`), then its logits (`Graph`) against specviz's module's on random
    inputs: the largest difference over the draft vocabulary and how many rows keep their greedy draft."""
    import torch

    from specviz.serving.export_common import vocab_ids_of

    vocab_ids = vocab_ids_of(cfg, state)
    graph = Graph(path)
    verify(graph.reader, arch, cfg, int(vocab_ids.numel()), "vocab_ids" in state, path)
    if "d2t" in graph.t and not torch.equal(graph.t["d2t"].long(), vocab_ids):
        raise ExportError(f"{path}: d2t does not give the drafter's vocab_ids as absolute target ids")
    module = _specviz_module(cfg, state)
    g = torch.Generator().manual_seed(0)
    d = cfg.hidden_size
    embed = embed.double()
    head = embed[vocab_ids]
    with torch.no_grad():
        if arch == "eagle3":
            feats = torch.randn(rows, len(cfg.feature_layers) * d, generator=g, dtype=torch.float64)
            embeds = embed[torch.randint(0, cfg.vocab_size, (rows,), generator=g)]
            pos = torch.arange(rows)
            h, _ = module(module.lift(feats[None]), embeds[None], pos)
            mine = module.readout(h)[0] @ head.T
            theirs = graph.eagle3(feats, embeds, pos)
        else:
            if graph.block_size != cfg.block_size or graph.mask != cfg.mask_token_id:
                raise ExportError(f"{path}: block_size {graph.block_size}, mask token {graph.mask}: the drafter's "
                                  f"are {cfg.block_size}, {cfg.mask_token_id}")
            feats = torch.randn(rows, len(cfg.feature_layers) * d, generator=g, dtype=torch.float64)
            ids = torch.full((cfg.block_size,), graph.mask)
            ids[0] = int(torch.randint(0, cfg.vocab_size, (1,), generator=g))
            embeds = embed[ids]
            pos_ctx, pos_block = torch.arange(rows), torch.arange(rows, rows + cfg.block_size)
            ctx = module.context_kv(feats[None], pos_ctx)
            mine = module.readout(module(embeds[None], pos_block, ctx))[0, 1:] @ head.T
            theirs = graph.dflash(feats, embeds, pos_ctx, pos_block)[1:]
    at = theirs[:, vocab_ids] if "d2t" in graph.t else theirs
    diff = float((at - mine).abs().max())
    scale = max(1.0, float(mine.abs().max()))  # specviz's rotary and norms round in fp32: relative to the logits
    same = int((theirs.argmax(-1) == vocab_ids[mine.argmax(-1)]).sum())
    n = mine.shape[0]
    if diff > TOLERANCE * scale or same != n:
        raise ExportError(f"{path}: the GGUF's logits as llama.cpp computes them differ from the drafter's by "
                          f"{diff:.2e} (largest logit {scale:.0f}; greedy draft equal on {same}/{n} rows)")
    return {"file": path.name, "rows": n, "max_abs_logit_diff": diff, "largest_logit": scale, "argmax_equal": same,
            "reader": f"gguf's reader: every tensor and key the pinned {arch} loader asks for, as it asks"}
