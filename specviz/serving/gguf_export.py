"""A Llama's tensors as an F32 GGUF for llama.cpp (the target's `-m`, the draft model's --model-draft), checked through
transformers' GGUF reader."""
from __future__ import annotations

from pathlib import Path

from specviz.serving.export_common import ExportError


def permute(w, n_head: int):
    """HF's q/k rows -> llama.cpp's rotary layout (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(tensors: dict, path: Path, hf_dir: Path, name: str, heads: int, kv_heads: int) -> dict:
    """A Llama folder's tensors as an F32 GGUF for llama.cpp (the target's `-m`, the draft model's --model-draft):
    the embedded target GGUF's tokenizer and metadata with these tensors and their layer count; checked by loading
    it with transformers' GGUF reader and comparing its logits with the Hugging Face folder's."""
    import gguf
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM

    from specviz.serving.server import embedded_gguf

    reader = gguf.GGUFReader(str(embedded_gguf()))
    writer = gguf.GGUFWriter(str(path), "llama")
    skip = {"general.architecture", "general.file_type", "general.quantization_version", "llama.block_count",
            "general.name"}
    for key, field in reader.fields.items():
        if key in skip or key.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    writer.add_name(name)
    writer.add_block_count(len({k.split(".")[2] for k in tensors if k.startswith("model.layers.")}))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    t = {k: v.float().numpy() for k, v in tensors.items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, value in t.items():
        if name in names:
            writer.add_tensor(names[name], np.ascontiguousarray(value))
            continue
        i, rest = name.removeprefix("model.layers.").split(".", 1)
        part = rest.removesuffix(".weight")
        if part == "self_attn.q_proj":
            value = permute(value, heads)
        elif part == "self_attn.k_proj":
            value = permute(value, kv_heads)
        writer.add_tensor(f"blk.{i}.{parts[part]}.weight", np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ids = torch.randint(0, t["model.embed_tokens.weight"].shape[0], (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()(input_ids=ids).logits
        b = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()(
            input_ids=ids).logits
    diff = float((a - b).abs().max())
    if diff > 1e-3:
        raise ExportError(f"{path}: the GGUF's logits differ from the Hugging Face export's by {diff:.2e}")
    return {"file": path.name, "max_abs_logit_diff": diff, "reader": "transformers GGUF"}
