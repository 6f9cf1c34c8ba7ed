"""The roofline of decoding: what a target forward must stream from memory, how fast this machine reads, and how
close each forward of k tokens comes to that limit (`python -m specviz profile`, the app's check tab).

A decode step reads every weight once whatever the number of rows it carries (the rows share each weight as it
streams by), plus each row's keys and values. On a machine that reads B bytes a second, a step of W weight bytes
cannot take less than W / B: that is the floor under AR's step, and it is why verifying k drafted tokens costs
little more than one, until the arithmetic of k rows catches up with the reads.

Bytes counted per forward of k tokens over a context of n cached tokens:
- weights: every parameter the forward reads in full (tied input embeddings and LM head counted once: the
  embedding lookup reads k rows, the head reads the whole matrix);
- KV cache: each layer's keys and values of the n + k positions, read once (the rows of one forward share them
  as they stream through the cache).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch

from specviz.core.cache import clock
from specviz.metrics import CostProfile

BANDWIDTH_BYTES = 512 << 20   # the buffer the read bandwidth is measured over: far past any last-level cache
BANDWIDTH_REPS = 5            # timed sums (median), after one warm-up


def read_bandwidth(device: torch.device | str = "cpu", nbytes: int = BANDWIDTH_BYTES,
                   reps: int = BANDWIDTH_REPS) -> float:
    """Bytes per second `device` reads: the median time of torch.sum over `nbytes` of bf16 (one pass, nothing
    written back; on the CPU with torch's threads, the ones the engines use)."""
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    times = []
    for rep in range(reps + 1):
        t0 = clock(x.device)
        x.sum()  # bf16 in, one bf16 out: the vectorised reduction (dtype=float32 takes a slow path, 1.3 GB/s)
        t1 = clock(x.device)
        if rep:
            times.append(t1 - t0)
    del x
    return nbytes / statistics.median(times)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter a forward reads in full (shared tensors, such as tied embeddings, counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def kv_bytes_per_token(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Bytes of keys and values one cached position holds across all layers."""
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class Roofline:
    bandwidth_gb_s: float            # measured read bandwidth
    weight_bytes: int                # read once a forward, whatever k
    kv_bytes_per_token: int          # per cached position
    context: int                     # cached positions of the profile
    tokens: list[int]                # k
    bytes_per_step: list[int]        # weights + KV of context + k positions, per k
    achieved_gb_s: list[float]       # bytes_per_step / T(k)
    floor_ms: list[float]            # bytes_per_step / bandwidth: the least a forward of k tokens can take
    roofline_tok_s: float            # AR's ceiling: 1 / floor of one token
    ar_tok_s: float                  # 1 / T(1) as measured
    probe_gb_s: float = 0.0          # what read_bandwidth read; bandwidth_gb_s is AR's own rate where that is higher

    @property
    def ar_share(self) -> float:
        """How much of the read bandwidth AR's step uses: floor(1) / T(1)."""
        return self.ar_tok_s / self.roofline_tok_s

    def to_dict(self) -> dict:
        return {**asdict(self), "ar_share": self.ar_share}


def roofline(model: torch.nn.Module, dtype: torch.dtype, profile: CostProfile, bandwidth: float) -> Roofline:
    """Bytes per step, achieved GB/s and the floor for each k of a verify profile, at `bandwidth` bytes/s (the
    read probe's), or at AR's own read rate where AR read faster than the probe did: a ceiling is never below what
    was reached (the probe read 13.1 GB/s on a busy AVX2 EPYC where AR's step streamed 115% of that)."""
    w, kv = weight_bytes(model), kv_bytes_per_token(model, dtype)
    steps = [w + kv * (profile.context + k) for k in profile.tokens]
    probe, bandwidth = bandwidth, max(bandwidth, steps[0] / profile.raw_seconds[0])
    return Roofline(bandwidth / 1e9, w, kv, profile.context, list(profile.tokens), steps,
                    [b / s / 1e9 for b, s in zip(steps, profile.raw_seconds)],
                    [1000 * b / bandwidth for b in steps], bandwidth / steps[0], 1 / profile.raw_seconds[0],
                    probe / 1e9)


def probe_note(r: Roofline) -> str:
    """Where AR out-read the read probe, that said in words ("" otherwise)."""
    if r.probe_gb_s >= r.bandwidth_gb_s:
        return ""
    return (f"the read probe (torch.sum over {BANDWIDTH_BYTES >> 20} MiB) read only {r.probe_gb_s:.1f} GB/s, so AR's "
            "own step sets the bound")


def format_roofline(r: Roofline) -> str:
    how = probe_note(r) or f"torch.sum over {BANDWIDTH_BYTES >> 20} MiB"
    lines = [f"roofline: reads {r.bandwidth_gb_s:.1f} GB/s ({how}); a step "
             f"streams {r.weight_bytes / 1e6:.0f} MB of weights + {r.kv_bytes_per_token / 1e3:.1f} kB of KV a cached "
             f"token; AR {r.ar_tok_s:.1f} tok/s of a {r.roofline_tok_s:.1f} tok/s ceiling ({r.ar_share:.0%})",
             "| k | MB a forward | floor ms | achieved GB/s |", "|---|---|---|---|"]
    for k, b, floor, gbs in zip(r.tokens, r.bytes_per_step, r.floor_ms, r.achieved_gb_s):
        lines.append(f"| {k} | {b / 1e6:.1f} | {floor:.1f} | {gbs:.1f} |")
    return "\n".join(lines)
