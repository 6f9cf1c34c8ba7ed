"""Trained drafters for a target: EAGLE (one decoder layer over the target's features), Medusa heads,
LayerSkip's exit adapter and a distilled draft model (a few decoder layers of its own).

All reuse the target's embeddings and LM head, so only a few million weights are theirs; EAGLE-1 and
Medusa read the target's last hidden state (after its final norm: the "feature" its LM head reads), EAGLE-3 its
hidden states after a low, a middle and a high layer, side by side. The LM head can be
compressed to the N most frequent tokens (`vocab_ids`): on a 135M target the full head is a fifth of
the weights and would dominate the drafting cost.

Saved as a folder: `model.safetensors` (the drafter's own weights and `vocab_ids`), `config.json`, and a
`README.md` model card. Parameter names follow the published EAGLE-1, EAGLE-3 and Medusa-1 layouts, so those
checkpoints load too (see `read_layout`).
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from specviz import methods
from specviz.drafters.config import KINDS, DrafterConfig, DrafterError, read_config
from specviz.drafters.dflash import DFlash
from specviz.drafters.modules import Eagle, Eagle3, load_into, rotary
from specviz.models import fused, kernels

FUSED = {Eagle3: fused.FusedEagle3, DFlash: fused.FusedDFlash}  # modules with a C step: the step's class


class Drafter:
    """A trained drafter bound to its target: the module plus the target's embeddings and (compressed) LM head."""

    def __init__(self, module: nn.Module, cfg: DrafterConfig, target_model: nn.Module, vocab_ids: torch.Tensor | None,
                 folder: Path | None = None):
        self.module, self.cfg, self.folder = module.eval(), cfg, folder
        self.module.requires_grad_(False)
        self.readout = getattr(module, "readout", None)  # EAGLE's: what the LM head reads from its output
        self.dtype = next(module.parameters()).dtype  # what the module computes in (module_dtype)
        self.target_embed = target_model.get_input_embeddings()
        self.final_norm = target_model.get_decoder().norm  # layerskip exits through the target's own norm
        self.target_model = target_model  # layerskip drafts through its first layers (engines/layerskip_chain.py)
        output = target_model.get_output_embeddings()
        weight = output.weight
        self.vocab_ids = vocab_ids  # (N,) or None for the full vocabulary
        self._vocab_list: list[int] | None = None  # vocab_ids as a list (target_ids)
        if getattr(module, "lm_head", None) is not None:  # a published EAGLE-3 drafter's own head over its vocabulary
            self.head_weight = module.lm_head.weight
        else:
            self.head_weight = weight if vocab_ids is None else weight[vocab_ids].detach().to(self.dtype)  # (N, d)
        # where the target's or the module's matmuls run on specviz's bf16 row kernel, the draft head does too (a third
        # faster for one row than torch's emulated bf16 on AVX2: 0.99 against 1.43 ms for 8192 x 576, one thread)
        on_kernel = any(isinstance(m, kernels.RowLinear) for m in (output, *module.modules()))
        self.row_kernel = on_kernel and self.head_weight.dtype == torch.bfloat16 and self.head_weight.is_contiguous()
        # there, the head's weight packed once for the packed matmul (fused.PackedLinear's, as the module's Linears)
        self.head_packed = fused.pack(self.head_weight) if self.row_kernel else None
        # there, an EAGLE-3 module's step (fc and its layer) in one C call (fused.FusedEagle3), a DFlash module's
        # context rows and block in one each (fused.FusedDFlash); SPECVIZ_FUSED=0: torch
        tables = functools.partial(rotary, hd=cfg.hidden_size // cfg.num_attention_heads, theta=cfg.rope_theta,
                                   dtype=torch.bfloat16)
        kind = FUSED.get(type(module))
        self.fused = (kind(module, tables) if kind is not None and self.row_kernel and self.dtype == torch.bfloat16
                      and os.environ.get("SPECVIZ_FUSED") != "0" else None)

    @property
    def c_table(self) -> torch.Tensor | None:
        """The target's embeddings where a C step reads them itself (its own step, a packed head, bf16 contiguous
        rows: EAGLE-3's context call, DFlash's block), else None."""
        table = self.target_embed.weight
        ok = (self.fused is not None and self.head_packed is not None and table.dtype == torch.bfloat16
              and table.is_contiguous())
        return table if ok else None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's embeddings of ids, in the module's dtype."""
        return self.target_embed(ids).to(self.dtype)

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """The target's features (or any tensor the module reads) on the module's device, in its dtype."""
        return x.to(self.head_weight.device, self.dtype)

    @functools.cached_property
    def datastore(self):
        """The datastore of the answers it was trained on when they were your own data (train writes it beside the
        weights, retrieval.DATASTORE_FILE), else None: the target's own datastore then serves
        (retrieval.datastore_for)."""
        from specviz.core import retrieval

        path = self.folder / retrieval.DATASTORE_FILE if self.folder else None
        return retrieval.Datastore.load(path) if path and path.is_file() else None

    @property
    def features(self):
        """What the drafter reads from each target forward (CachedLM.logits' `features`): True for the final-norm
        hidden state, or the hidden-state indices EAGLE-3 fuses."""
        return tuple(self.cfg.feature_layers) or True

    @property
    def feature_size(self) -> int:
        return self.cfg.hidden_size * max(1, len(self.cfg.feature_layers))

    @property
    def kind(self) -> str:
        return self.cfg.kind

    def logits(self, feats: torch.Tensor, head: int | None = None) -> torch.Tensor:
        """Draft logits over the draft vocabulary (..., N)."""
        rows = feats.reshape(-1, feats.shape[-1])  # (r, d): a head on 2-D rows never copies its weight
        if self.fused is not None:
            rows = self.fused.readout(rows)
        elif self.readout is not None:
            rows = self.readout(rows)
        if head is not None and self.cfg.own_lm_heads:
            out = self.module.heads[head][1](rows)
        else:
            rows = rows.to(self.head_weight.dtype)
            out = (fused.linear_packed(rows, self.head_packed, self.head_weight.shape[0]) if self.row_kernel
                   else torch.nn.functional.linear(rows, self.head_weight))  # (r, N)
        return out.reshape(*feats.shape[:-1], out.shape[-1])

    def draw(self, logits: torch.Tensor, cfg, generator: torch.Generator) -> tuple[int, torch.Tensor, float]:
        """One draft token from draft-vocabulary logits (N,): the target id, the distribution it was drawn
        from over the target's vocabulary (V,), and its probability there."""
        from specviz.core.sampling import pick, warp

        q = warp(logits.float().cpu(), cfg)  # (N,)
        index = pick(q, cfg.greedy, generator)
        return int(self.to_target_ids(torch.tensor(index))), self.scatter(q), float(q[index])

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.vocab_ids is None else self.vocab_ids[draft_ids]

    def target_ids(self, draft_ids: list[int]) -> list[int]:
        """to_target_ids on a list, without a tensor (a tree's nodes each step)."""
        if self.vocab_ids is None:
            return [int(i) for i in draft_ids]
        if self._vocab_list is None:
            self._vocab_list = self.vocab_ids.tolist()
        return [self._vocab_list[i] for i in draft_ids]

    def scatter(self, probs: torch.Tensor) -> torch.Tensor:
        """A distribution over the draft vocabulary (..., N) as one over the target's (..., V)."""
        if self.vocab_ids is None:
            return probs
        out = probs.new_zeros(*probs.shape[:-1], self.cfg.vocab_size)
        out[..., self.vocab_ids] = probs
        return out


def module_class(cfg: DrafterConfig) -> type[nn.Module]:
    """The module of a drafter's kind (methods.MethodSpec.module); EAGLE-3's for an EAGLE drafter fusing features."""
    if cfg.kind not in KINDS:
        raise DrafterError(f"drafter kind {cfg.kind!r} is unknown: use one of {', '.join(KINDS)}")
    cls = methods.load(methods.spec(cfg.kind).module)
    return Eagle3 if cls is Eagle and cfg.feature_layers else cls


def build_module(cfg: DrafterConfig, target_model: nn.Module | None = None) -> nn.Module:
    """A drafter's module; given the target, started from its layers where the kind starts so (DraftLM.from_target)."""
    cls = module_class(cfg)
    return cls.from_target(cfg, target_model) if target_model is not None and hasattr(cls, "from_target") else cls(cfg)


def choose_tree(accuracy: torch.Tensor, size: int) -> list[tuple[int, ...]]:
    """The `size` nodes with the highest expected acceptance, where accuracy[k, r] is how often head k's
    rank-r candidate is the target's token; a node's value is the product along its path (Medusa's
    estimate). Grown greedily from the root, so every chosen node's parent is chosen."""
    heads, ranks = accuracy.shape
    chosen: list[tuple[int, ...]] = []
    frontier = {(r,): float(accuracy[0, r]) for r in range(ranks)}
    while frontier and len(chosen) < size:
        best = max(frontier, key=lambda p: (frontier[p], -len(p)))
        value = frontier.pop(best)
        chosen.append(best)
        if len(best) < heads:
            for r in range(ranks):
                frontier[best + (r,)] = value * float(accuracy[len(best), r])
    return sorted(chosen, key=lambda p: (len(p), p))


def path_value(accuracy: torch.Tensor, path: tuple[int, ...]) -> float:
    """The chance a tree node is accepted: the product of accuracy[depth, rank] along its path."""
    value = 1.0
    for depth, rank in enumerate(path):
        value *= float(accuracy[depth, rank])
    return value


def tree_for_cost(accuracy: torch.Tensor, ratio, level_cost: float, max_size: int = 32,
                  step_cost: float = 0.0) -> tuple[list, float, float]:
    """The tree (choose_tree of the best size) that commits the most tokens per unit of time: a step commits
    1 + the sum of its nodes' values and costs ratio(1 + size) one-token steps to verify (the profile's T(k)/T(1)),
    plus level_cost per tree level drafted (EAGLE drafts level by level) and step_cost once (Medusa's heads run
    once per step). Returns (tree, expected tokens per step, predicted speedup)."""
    best = None
    for size in range(1, max_size + 1):
        tree = choose_tree(accuracy, size)
        tokens = 1 + sum(path_value(accuracy, p) for p in tree)
        speed = tokens / (ratio(1 + len(tree)) + level_cost * max(len(p) for p in tree) + step_cost)
        if best is None or speed > best[2]:
            best = (tree, tokens, speed)
    return best


def coverage(vocab_ids: torch.Tensor | None, token_ids: list[int]) -> float | None:
    """The share of token_ids a compressed draft vocabulary holds (the rest can never be drafted); None for the
    full vocabulary or no tokens."""
    if vocab_ids is None or not token_ids:
        return None
    return float(torch.isin(torch.tensor(token_ids), vocab_ids.cpu()).float().mean())


def frequent_vocab(sequences, vocab_size: int, n: int) -> torch.Tensor:
    """The n most frequent token ids in the data, topped up with the lowest unseen ids (BPE merges come
    roughly in frequency order), sorted."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        counts += torch.bincount(torch.tensor(seq, dtype=torch.long), minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted(order[:n]), dtype=torch.long)


def save(folder: str | Path, module: nn.Module, cfg: DrafterConfig, vocab_ids: torch.Tensor | None, card: str) -> None:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in module.state_dict().items()}
    if vocab_ids is not None:
        tensors["vocab_ids"] = vocab_ids.to(torch.int32).contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    (folder / "README.md").write_text(card)


def _weights_file(folder: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise DrafterError(f"drafter folder {str(folder)!r} has none of {', '.join(names)}")


def read_layout(folder: Path, target) -> tuple[DrafterConfig, dict[str, torch.Tensor]]:
    """The config and weights of a drafter folder in one of three layouts: ours (config.json with "kind"),
    Medusa-1 (config.json with medusa_num_heads; medusa_lm_head.*), EAGLE-3 (fc over three features, midlayer.*,
    lm_head, d2t) or EAGLE-1 (a llama config.json; weights
    with fc.weight and layers.0.*). Weights are read as safetensors or weights_only tensors, never code."""
    from specviz.models.weights import load_state_dict

    raw = read_config(folder)
    if "kind" in raw:
        return DrafterConfig.from_dict(raw, f"drafter {str(folder)!r}"), load_state_dict(
            _weights_file(folder, ("model.safetensors",)))
    try:
        cfg, state = _published_layout(folder, raw, target)
    except DrafterError:  # already one line naming what is wrong
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a field of the wrong type or shape
        raise DrafterError(f"drafter {str(folder)!r}: its config.json or weights do not fit a published layout "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})") from None
    return DrafterConfig.from_dict(asdict(cfg), f"drafter {str(folder)!r}"), state  # the fields it took, checked


def _published_layout(folder: Path, raw: dict, target) -> tuple[DrafterConfig, dict[str, torch.Tensor]]:
    """read_layout for Medusa-1, EAGLE-1 and EAGLE-3 checkpoints (config.json without "kind")."""
    from specviz.models.weights import load_state_dict

    mc = target.model.config
    if "medusa_num_heads" in raw:
        if int(raw.get("medusa_num_layers", 1)) != 1:
            raise DrafterError(f"Medusa checkpoint {str(folder)!r} has {raw['medusa_num_layers']} layers per head: "
                               "only 1 is supported")
        state = load_state_dict(_weights_file(folder, ("medusa_lm_head.safetensors", "medusa_lm_head.pt")))
        own = any(k.endswith(".1.weight") for k in state)
        cfg = DrafterConfig.for_target("medusa", raw.get("base_model_name_or_path", target.name), mc,
                                       medusa_heads=int(raw["medusa_num_heads"]), own_lm_heads=own)
        return cfg, {f"heads.{k}": v for k, v in state.items()}
    state = load_state_dict(_weights_file(folder, ("model.safetensors", "pytorch_model.bin")))
    if "fc.weight" not in state:
        raise DrafterError(f"drafter folder {str(folder)!r} is in no known layout: expected specviz's, Medusa-1's "
                           "(medusa_num_heads), EAGLE-1's (fc.weight, layers.0.*) or EAGLE-3's (fc.weight, midlayer.*)")
    if any(k.startswith("midlayer.") for k in state):
        return _eagle3_layout(folder, raw, state, target)
    state = {k: v for k, v in state.items() if k.startswith(("fc.", "layers.0."))}  # the target supplies embeddings
    cfg = DrafterConfig.for_target("eagle", target.name, mc, input_norm="layers.0.input_layernorm.weight" in state,
                                   fc_bias="fc.bias" in state)
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps"):
        if key in raw:
            setattr(cfg, key, raw[key])
    cfg.rope_theta = float(raw.get("rope_theta", cfg.rope_theta))
    return cfg, state


def eagle3_layers(n_layers: int) -> list[int]:
    """EAGLE-3's fused hidden states: after 2 layers, half of them, and all but 3 (as its reference code and
    vLLM capture them: the input of layers 2, L // 2 and L - 3), kept within 0..L - 1 for shallow models (index L
    would be transformers' final-norm state)."""
    return [min(max(i, 0), n_layers - 1) for i in (2, n_layers // 2, n_layers - 3)]


def _eagle3_layout(folder: Path, raw: dict, state: dict, target) -> tuple[DrafterConfig, dict[str, torch.Tensor]]:
    """A published EAGLE-3 checkpoint: fc over three concatenated target features, `midlayer`, `norm`, its own
    `lm_head` over a draft vocabulary, and `d2t` (draft id -> target id offset; `t2d` is its inverse, a mask)."""
    mc = target.model.config
    d = int(raw.get("hidden_size", mc.hidden_size))
    layers = ((raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
              or eagle3_layers(mc.num_hidden_layers))
    if state["fc.weight"].shape[1] != len(layers) * d:
        raise DrafterError(f"EAGLE-3 checkpoint {str(folder)!r}: fc reads {state['fc.weight'].shape[1]} features, "
                           f"not {len(layers)} target layers of {d}")
    if not all(0 <= int(i) < mc.num_hidden_layers for i in layers):
        raise DrafterError(f"EAGLE-3 checkpoint {str(folder)!r} fuses hidden states {list(layers)}: the target "
                           f"{target.name} has {mc.num_hidden_layers} layers "
                           f"(use indices 0..{mc.num_hidden_layers - 1})")
    head = state.get("lm_head.weight")
    n_draft = int(head.shape[0]) if head is not None else int(raw.get("draft_vocab_size", mc.vocab_size))
    cfg = DrafterConfig.for_target("eagle", target.name, mc, 0 if n_draft == mc.vocab_size else n_draft,
                                   feature_layers=[int(i) for i in layers], own_lm_head=head is not None)
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps"):
        if key in raw:
            setattr(cfg, key, raw[key])
    cfg.rope_theta = float(raw.get("rope_theta", cfg.rope_theta))
    out = {k: v for k, v in state.items() if k.startswith(("fc.", "midlayer.", "norm.", "lm_head."))}
    if cfg.draft_vocab:
        if "d2t" not in state:
            raise DrafterError(f"EAGLE-3 checkpoint {str(folder)!r} has a {n_draft}-token head but no d2t map")
        out["vocab_ids"] = torch.arange(n_draft) + state["d2t"].long()  # target id = draft id + d2t[draft id]
    return cfg, out


def load(folder: str | Path, target) -> Drafter:
    """A drafter folder (ours, Medusa-1, EAGLE-1 or EAGLE-3 layout), bound to a loaded target (LoadedModel)."""
    folder = Path(folder)
    cfg, state = read_layout(folder, target)
    if cfg.hidden_size != target.model.config.hidden_size or cfg.vocab_size != target.vocab_size:
        raise DrafterError(f"drafter {str(folder)!r} was trained for {cfg.target} (hidden {cfg.hidden_size}, vocab "
                           f"{cfg.vocab_size}); the target {target.name} has hidden {target.model.config.hidden_size}, "
                           f"vocab {target.vocab_size}")
    vocab_ids = state.pop("vocab_ids", None)
    check_vocab_ids(vocab_ids, cfg, str(folder))
    module = build_module(cfg)
    load_into(module, state, str(folder))
    dtype = module_dtype(cfg, target)
    module.to(device=target.device, dtype=dtype)
    if target.device.type == "cpu" and dtype == torch.bfloat16 and (cfg.kind in SMALL_KINDS
                                                                     or target.matmul == "specviz row kernel"):
        kernels.swap_in(module, bias=True, kind=fused.PackedLinear)  # its Linears on the packed matmul, as its head
    return Drafter(module, cfg, target.model, None if vocab_ids is None else vocab_ids.long().to(target.device), folder)


def check_vocab_ids(vocab_ids: torch.Tensor | None, cfg: DrafterConfig, name: str) -> None:
    """A compressed draft vocabulary holds draft_vocab distinct target ids (one line naming what is wrong)."""
    if vocab_ids is None:
        if cfg.draft_vocab and not cfg.own_lm_head:
            raise DrafterError(f"drafter {name!r}: config.json names a {cfg.draft_vocab}-token draft vocabulary but "
                               "the weights hold no vocab_ids")
        return
    if vocab_ids.dim() != 1 or vocab_ids.is_floating_point() or (cfg.draft_vocab and len(vocab_ids) != cfg.draft_vocab):
        raise DrafterError(f"drafter {name!r}: vocab_ids is {list(vocab_ids.shape)} {str(vocab_ids.dtype)[6:]}, not "
                           f"{cfg.draft_vocab or 'N'} integer token ids")
    if len(vocab_ids) and not (0 <= int(vocab_ids.min()) and int(vocab_ids.max()) < cfg.vocab_size):
        raise DrafterError(f"drafter {name!r}: vocab_ids reach {int(vocab_ids.max())}, outside the target's "
                           f"vocabulary of {cfg.vocab_size}")


SMALL_KINDS = methods.names(lambda s: s.small)  # one-layer drafters: a few rows through small matmuls per call


def module_dtype(cfg: DrafterConfig, target) -> torch.dtype:
    """What a drafter's module computes in. On a CPU beside a bf16 target the one-layer drafters (SMALL_KINDS) run in
    bf16 on specviz's kernels (load: the packed matmul, fused.PackedLinear; torch's bf16 matmul ran their one-row
    matmuls at about half fp32's speed), or in fp32 where the kernels are not built: the same drafts, faster
    (experiments/probes/drafter_dtype_ab.py, drafter_packed_ab.py; the figures in experiments/LOG.md). Elsewhere,
    the target's dtype (the GPU; the draft model, a stack of the target's own layers). Drafts only propose:
    verification stays exact."""
    if target.device.type != "cpu" or cfg.kind not in SMALL_KINDS:
        return target.dtype
    return torch.bfloat16 if target.dtype == torch.bfloat16 and kernels.available() else torch.float32


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def describe(cfg: DrafterConfig) -> str:
    vocab = f"draft vocabulary {cfg.draft_vocab} of {cfg.vocab_size}" if cfg.draft_vocab else "full vocabulary"
    return module_class(cfg).describe(cfg, vocab)

