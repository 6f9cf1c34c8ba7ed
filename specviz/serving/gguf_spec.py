"""EAGLE-3 and DFlash drafters as GGUFs for llama.cpp's llama-server (`export eagle|dflash --format gguf`; served
with `--spec-type draft-eagle3|draft-dflash --model-draft FILE`), written with the `gguf` package the way the pinned
source's converter writes them (out/llama.cpp/.../conversion/llama.py for EAGLE-3, conversion/qwen.py DFlashModel)
and checked against what the pinned loader asks for (src/models/eagle3.cpp, dflash.cpp `load_arch_*`).

What llama.cpp does with them, and so what is written:
- EAGLE-3 (arch `eagle3`): `fc`, one layer `blk.0.*` whose attention reads [attn_norm(embedding), attn_norm_2(g)]
  (2d wide), `output_norm`, `output` over the draft vocabulary and `d2t` (I64, the ABSOLUTE target id of each draft
  row: the converter adds arange to the offsets vLLM's layout keeps); the graph scatters the draft logits into the
  target's vocabulary with -inf elsewhere, so a greedy draft is specviz's. Its rope is NORM (pairwise), so q and k
  are permuted as for a Llama. The token embeddings are the target's (none in the file). `target_layers` are the
  hidden states it reads (the input of layer i, transformers' hidden_states[i]: specviz's feature_layers as they
  are); the pinned loader requires exactly three.
- DFlash (arch `dflash`): `fc` and `enc.output_norm` (hidden_norm) make the context rows, each `blk.i` projects them
  through its own attn_k / attn_v (+ attn_k_norm, rope) into the draft's KV cache; the block [last token, mask x n]
  runs through attn_norm, q/k/v with q/k norms, non-causal attention, ffn; `output_norm`, `output` + `d2t` as above.
  Its rope is NEOX (halves, transformers' layout): no permutation. `target_layers` = the converter's
  target_layer_ids + 1 = specviz's feature_layers; `block_size`, and `tokenizer.ggml.mask_token_id` (llama.cpp
  reads the mask token from the vocabulary). llama.cpp runs a block of n_max + 1 tokens (common/speculative.cpp
  `draft`), specviz always one of block_size, and the block is bidirectional: serve with n_max = block_size - 1.

Both carry the target's tokenizer (the target GGUF's tokenizer.* keys), as the converter's --target-model-dir does.
Checked by reading the file back with gguf's reader: every tensor the pinned loader creates is there, named and
shaped as it asks, and nothing else; then the drafter's logits computed from the file's tensors the way the pinned
graph computes them (gguf_graph.py) equal specviz's own module's.
"""
from __future__ import annotations

from pathlib import Path

from specviz.serving.export_common import (
    DrafterExport,
    ExportError,
    drafter_arg,
    state_rows,
    target_tensors,
    vocab_ids_of,
)
from specviz.serving.gguf_export import permute

FILE = "draft.gguf"         # what --model-draft gets (engines._plan_llama serves FILE from the export folder)
CONTEXT_LENGTH = 8192       # the drafters' rope context, as the target's config gives it
TOKENIZER = "tokenizer."    # the target GGUF's keys copied into every drafter GGUF


def tokenizer_source(target_dir: Path) -> Path:
    """The GGUF whose tokenizer the drafter carries: the target export's fp32 GGUF, else the embedded one."""
    from specviz.serving.export_common import TARGET_GGUF
    from specviz.serving.server import embedded_gguf

    own = Path(target_dir) / TARGET_GGUF
    return own if own.is_file() else embedded_gguf()


def _llama_keys(writer, cfg, layers: int, tc: dict) -> None:
    """The hyperparameters llama.cpp's generic loader reads for every arch (llama-model.cpp load_hparams)."""
    import gguf

    hd = cfg.hidden_size // cfg.num_attention_heads
    writer.add_context_length(int(tc.get("max_position_embeddings", CONTEXT_LENGTH)))
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_rope_dimension_count(hd)
    writer.add_rope_freq_base(float(cfg.rope_theta))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)


def _copy_tokenizer(writer, source: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(str(source))
    for key, field in reader.fields.items():
        if key.startswith(TOKENIZER):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), vtype, sub_type=sub)


def write_file(path: Path, arch: str, name: str, keys, tensors: dict, tokenizer: Path) -> None:
    """One GGUF: general.*, `keys(writer)`, the tokenizer, then `tensors` ({gguf name: numpy array}, int64 as I64)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    keys(writer)
    _copy_tokenizer(writer, tokenizer)
    for key, value in tensors.items():
        value = np.ascontiguousarray(value)
        raw = gguf.GGMLQuantizationType.I64 if value.dtype == np.int64 else None
        writer.add_tensor(key, value, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _head(cfg, state: dict, target_dir: Path):
    """(output.weight: the target's embedding rows at the draft vocabulary, d2t: their absolute target ids or None
    for a full-vocabulary drafter, the target's embedding)."""
    embed = target_tensors(target_dir)["model.embed_tokens.weight"].float()
    ids = vocab_ids_of(cfg, state)
    d2t = ids.numpy().astype("int64") if "vocab_ids" in state else None
    return embed[ids].numpy(), d2t, embed


def _f32(t):
    return t.float().numpy()


def _layer(state: dict, src: str, dst: str, heads: tuple[int, int] | None) -> dict:
    """One decoder layer's Llama tensors under llama.cpp's names (q/k permuted for a NORM-rope arch: `heads`)."""
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "hidden_norm": "attn_norm_2"}
    out = {}
    for part, gg in names.items():
        key = f"{src}.{part}.weight"
        if key not in state:
            continue
        value = _f32(state[key])
        if heads and part == "self_attn.q_proj":
            value = permute(value, heads[0])
        elif heads and part == "self_attn.k_proj":
            value = permute(value, heads[1])
        out[f"{dst}.{gg}.weight"] = value
    return out


# -- EAGLE-3 -------------------------------------------------------------------------------------------------------

def eagle3_gguf_tensors(cfg, state: dict, target_dir: Path) -> tuple[dict, object]:
    """({gguf name: array}, the target's embedding) of an EAGLE-3 drafter."""
    head, d2t, embed = _head(cfg, state, target_dir)
    tensors = {"fc.weight": _f32(state["fc.weight"]),
               **_layer(state, "midlayer", "blk.0", (cfg.num_attention_heads, cfg.num_key_value_heads)),
               "output_norm.weight": _f32(state["norm.weight"]), "output.weight": head}
    if d2t is not None:
        tensors["d2t"] = d2t
    return tensors, embed


def eagle3_keys(cfg, tc: dict):
    def keys(writer):
        arch = writer.arch
        _llama_keys(writer, cfg, 1, tc)
        writer.add_array(f"{arch}.target_layers", [int(i) for i in cfg.feature_layers])
        writer.add_uint32(f"{arch}.target_hidden_size", int(tc.get("hidden_size", cfg.hidden_size)))
        writer.add_bool(f"{arch}.norm_before_residual", False)  # specviz's residual is the un-normed g
        writer.add_bool(f"{arch}.norm_before_fc", False)
    return keys


def write_eagle3_gguf(cfg, state: dict, tc: dict, target_dir: Path, out: Path) -> dict:
    from specviz.serving.gguf_graph import check

    if len(cfg.feature_layers) != 3:
        raise ExportError(f"feature_layers={list(cfg.feature_layers)}: llama.cpp's EAGLE-3 reads exactly 3 target "
                          "layers (src/models/eagle3.cpp load_arch_hparams)")
    tensors, embed = eagle3_gguf_tensors(cfg, state, target_dir)
    path = out / FILE
    write_file(path, "eagle3", f"{cfg.target} EAGLE-3 drafter (specviz export)", eagle3_keys(cfg, tc), tensors,
               tokenizer_source(target_dir))
    return check("eagle3", cfg, state, embed, path)


# -- DFlash --------------------------------------------------------------------------------------------------------

def dflash_gguf_tensors(cfg, state: dict, target_dir: Path) -> tuple[dict, object]:
    head, d2t, embed = _head(cfg, state, target_dir)
    tensors = {"fc.weight": _f32(state["fc.weight"]), "enc.output_norm.weight": _f32(state["hidden_norm.weight"])}
    for i in range(cfg.num_hidden_layers):
        tensors.update(_layer(state, f"layers.{i}", f"blk.{i}", None))  # NEOX rope: transformers' layout
    tensors.update({"output_norm.weight": _f32(state["norm.weight"]), "output.weight": head})
    if d2t is not None:
        tensors["d2t"] = d2t
    return tensors, embed


def dflash_keys(cfg, tc: dict):
    def keys(writer):
        arch = writer.arch
        _llama_keys(writer, cfg, cfg.num_hidden_layers, tc)
        writer.add_array(f"{arch}.target_layers", [int(i) for i in cfg.feature_layers])
        writer.add_uint32(f"{arch}.block_size", int(cfg.block_size))
        writer.add_uint32("tokenizer.ggml.mask_token_id", int(cfg.mask_token_id))
    return keys


def write_dflash_gguf(cfg, state: dict, tc: dict, target_dir: Path, out: Path) -> dict:
    from specviz.serving.gguf_graph import check

    n_layer = int(tc.get("num_hidden_layers", 0))
    if n_layer and max(cfg.feature_layers) >= n_layer:
        raise ExportError(f"feature_layers={list(cfg.feature_layers)}: llama.cpp's DFlash reads the input of target "
                          f"layers 0..{n_layer - 1} only (common/speculative.cpp llama_set_embeddings_layer_inp)")
    tensors, embed = dflash_gguf_tensors(cfg, state, target_dir)
    path = out / FILE
    write_file(path, "dflash", f"{cfg.target} DFlash drafter (specviz export)", dflash_keys(cfg, tc), tensors,
               tokenizer_source(target_dir))
    return check("dflash", cfg, state, embed, path)


# -- READMEs and the exports ---------------------------------------------------------------------------------------

def _serve_line(out: Path, target_dir: Path, spec_type: str, n_max: int) -> str:
    from specviz.serving.export_common import TARGET_GGUF

    return (f"llama-server -m {Path(target_dir) / TARGET_GGUF} --model-draft {out / FILE} --spec-type {spec_type} \\\n"
            f"    --spec-draft-n-max {n_max} --spec-draft-n-min 0 --spec-draft-p-min 0 --metrics --port 8080")


def readme_eagle3(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    from specviz.serving.engines import GAMMA

    arg = drafter_arg(folder, cfg)
    return f"""# EAGLE-3 drafter for {cfg.target} as a GGUF for llama.cpp, exported by specviz

From {folder} (`python -m specviz export {arg} --format gguf`): `{FILE}`, arch `eagle3` as the pinned llama.cpp's
converter writes it: `fc` over the target's hidden states at layers {list(cfg.feature_layers)} (`target_layers`),
one layer `blk.0.*`, `output_norm`, `output` over {len(state_rows(cfg))} draft ids and `d2t` (their absolute target
ids, I64), the target's tokenizer. The target is {target_dir} (`python -m specviz export target`).

Checked: {check['reader']}; the logits the pinned graph computes from the file equal the original drafter's
(largest difference {check['max_abs_logit_diff']:.1e} over {check['rows']} rows, greedy draft equal on
{check['argmax_equal']}).

Serve it (`python -m specviz serve --engine llama.cpp --drafter {arg}` does this for you):

```bash
{_serve_line(out, target_dir, "draft-eagle3", GAMMA)}
```
"""


def readme_dflash(folder: Path, out: Path, target_dir: Path, cfg, check: dict) -> str:
    arg = drafter_arg(folder, cfg)
    return f"""# DFlash drafter for {cfg.target} as a GGUF for llama.cpp, exported by specviz

From {folder} (`python -m specviz export {arg} --format gguf`): `{FILE}`, arch `dflash` as the pinned llama.cpp's
converter writes it: `fc` + `enc.output_norm` over the target's hidden states at layers
{list(cfg.feature_layers)} (`target_layers`), {cfg.num_hidden_layers} layers `blk.*`, `output_norm`, `output` over
{len(state_rows(cfg))} draft ids and `d2t` (absolute target ids, I64), `block_size` {cfg.block_size}, the mask token
{cfg.mask_token_id} (`tokenizer.ggml.mask_token_id`) and the target's tokenizer.

Checked: {check['reader']}; the logits the pinned graph computes from the file equal the original drafter's
(largest difference {check['max_abs_logit_diff']:.1e} over {check['rows']} block rows, greedy draft equal on
{check['argmax_equal']}).

llama.cpp drafts a block of n_max + 1 tokens and its attention is bidirectional, so only n_max = block_size - 1
drafts what specviz drafts. Serve it (`python -m specviz serve --engine llama.cpp --drafter {arg}` does this):

```bash
{_serve_line(out, target_dir, "draft-dflash", cfg.block_size - 1)}
```
"""


EAGLE3 = DrafterExport("EAGLE-3 (GGUF)", "EAGLE-3", "eagle3-gguf", write_eagle3_gguf, readme_eagle3,
                       lambda cfg: None if cfg.feature_layers else "an EAGLE-1")
DFLASH = DrafterExport("DFlash (GGUF)", "DFlash", "dflash-gguf", write_dflash_gguf, readme_dflash,
                       lambda cfg: None if cfg.block_size >= 2 else f"a block_size={cfg.block_size} DFlash")
