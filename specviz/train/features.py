"""The target's features for training a drafter: its hidden states over the training sequences (every layer a
drafter fuses, cached on disk as float16 and resumable), the early exit's inputs for LayerSkip, and the batches
sampled from them."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from specviz.train import distill


def autocast(bf16: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


@torch.inference_mode()
def features_for(examples: list[dict], target, path: Path, log, layers: tuple = (),
                 bf16: bool = False) -> tuple[torch.Tensor, list[list[int]]]:
    """Stage 2: the target's final-norm hidden states of every sequence, (total, d) fp16; with `layers` (EAGLE-3),
    those hidden states after them too: (total, d + len(layers) * d), [final | fused]. bf16: the target's matmuls
    run in bf16 (autocast), as the engine runs it on such CPUs.
    They are written into a raw fp16 file at `path`, memory-mapped (all-chunk EAGLE-3 features are ~13 GB: held in
    RAM they took a 24 GiB machine to its limit), with `path`.json beside it recording what they are and how many
    groups of sequences are done, so a killed pass resumes where it stopped and a finished one is reused."""
    seqs = list(distill.sequences(examples))
    d = target.model.config.hidden_size
    key = {"n": len(seqs), "rows": sum(map(len, seqs)), "width": d * (1 + len(layers)), "layers": list(layers),
           "bf16": bf16}
    # Sequences of similar length run together, right-padded: under the causal mask the padding after a
    # sequence cannot reach its rows. Batches of 8 were twice the tokens/s of one at a time (2065 against
    # 1056 on 2 cores, bf16 autocast; 16 were slower again).
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    groups, group = [], []
    for i in order:  # at most FEATURE_BATCH sequences and FEATURE_TOKENS padded tokens (the longest run alone)
        if group and (len(group) == FEATURE_BATCH or (len(group) + 1) * len(seqs[i]) > FEATURE_TOKENS):
            groups.append(group)
            group = []
        group.append(i)
    groups.append(group)
    meta_path = path.with_name(path.name + ".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() and path.is_file() else {}
    done = meta.get("done", 0) if {k: meta.get(k) for k in key} == key else 0
    if done == len(groups):
        log(f"features: reusing {path}")
        return _mapped(path, key, shared=False), seqs
    if done:
        log(f"features: resuming {path} after {done} of {len(groups)} groups of sequences")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    feats = _mapped(path, key, shared=True)  # writes land in the file (the page cache), not in the process's memory
    offsets = offsets_of(seqs)
    decoder = target.model.get_decoder()
    from tqdm import tqdm

    bar = tqdm(total=len(seqs), initial=sum(map(len, groups[:done])), desc="features", unit="seq")
    saved = time.monotonic()
    for g in range(done, len(groups)):
        width = max(len(seqs[i]) for i in groups[g])
        ids = torch.tensor([seqs[i] + [0] * (width - len(seqs[i])) for i in groups[g]], device=target.device)
        with autocast(bf16):
            out = decoder(input_ids=ids, output_hidden_states=bool(layers))
        for row, i in enumerate(groups[g]):
            n = len(seqs[i])
            parts = [out.last_hidden_state[row, :n]] + [out.hidden_states[k][row, :n] for k in layers]
            feats[offsets[i]:offsets[i + 1]] = torch.cat(parts, -1).to(torch.float16).cpu()
        bar.update(len(groups[g]))
        if g + 1 == len(groups) or time.monotonic() - saved > 30:  # a process killed after this keeps these rows:
            meta_path.write_text(json.dumps({**key, "done": g + 1}))  # they are in the page cache, not its memory
            saved = time.monotonic()
    bar.close()
    return feats, seqs


def _mapped(path: Path, key: dict, shared: bool) -> torch.Tensor:
    """The features file as a (rows, width) fp16 tensor over a memory map (shared: writes go to the file; it is
    created at its full size)."""
    return torch.from_file(str(path), shared=shared, size=key["rows"] * key["width"], dtype=torch.float16).view(
        key["rows"], key["width"])


@torch.inference_mode()
def exit_features_for(examples: list[dict], target, layer: int, path: Path, log, bf16: bool = False) -> torch.Tensor:
    """Stage 2 for layerskip: the hidden states after `layer` target layers, (total, d) fp16, cached."""
    seqs = list(distill.sequences(examples))
    if path.is_file():
        saved = torch.load(path, weights_only=True, mmap=True)
        if saved["n"] == len(seqs) and saved["layer"] == layer and saved.get("bf16", False) == bf16:
            log(f"exit features: reusing {path}")
            return saved["features"]
    from tqdm import tqdm

    from specviz.engines.layerskip import SplitLM

    chunks = []
    for seq in tqdm(seqs, desc=f"layer-{layer} features", unit="seq"):
        lm = SplitLM(target.model, target.device, layer)  # only the first `layer` layers run
        with autocast(bf16):
            lm.early(seq)
        chunks.append(lm.pending[0][0].to(torch.float16).cpu())
    feats = torch.cat(chunks)
    torch.save({"n": len(seqs), "layer": layer, "bf16": bf16, "features": feats}, path)
    return feats


def offsets_of(seqs: list[list[int]]) -> list[int]:
    """Where each sequence starts in the rows of the concatenated features, and their total last."""
    offsets = [0]
    for seq in seqs:
        offsets.append(offsets[-1] + len(seq))
    return offsets


class Batches:
    """Random batches of whole sequences, right-padded, at most `batch_tokens` tokens each with the padding
    (or one longer sequence alone). `starts`: where each sequence's scored part begins (its answer, for a kind
    that trains on answers only); the rows before it stay in the batch as context but are not valid."""

    def __init__(self, seqs: list[list[int]], feats: torch.Tensor, batch_tokens: int, seed: int,
                 starts: list[int] | None = None):
        self.seqs, self.feats, self.batch_tokens, self.starts = seqs, feats, batch_tokens, starts
        self.offsets = offsets_of(seqs)
        self.rng = random.Random(seed)
        self.by_length = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))

    def sample(self, shuffle: bool = True):
        """shuffle: sequences of similar length around a random one (a batch pads to its longest sequence:
        drawn at random, a 2000-token sequence among short ones made most of a batch padding: 256-584 real
        tokens/s in an EAGLE-3 run whose steps reach about 1800 without padding); else the first sequences in order."""
        if shuffle:
            n, a = len(self.by_length), self.rng.randrange(len(self.by_length))
            length = lambda k: len(self.seqs[self.by_length[k]])  # noqa: E731 (ascending in k)
            lo, hi = a, a + 1
            while True:  # grow the window towards the longer side first, then the shorter, while the padded
                if hi < n and (hi - lo + 1) * length(hi) <= self.batch_tokens:  # batch fits the budget
                    hi += 1
                elif lo > 0 and (hi - lo + 1) * length(hi - 1) <= self.batch_tokens:
                    lo -= 1
                else:
                    break
            picked = self.by_length[lo:hi]
        else:
            picked, total = [], 0
            for i in range(len(self.seqs)):
                if total and total + len(self.seqs[i]) > self.batch_tokens:
                    break
                picked.append(i)
                total += len(self.seqs[i])
        return self.batch(picked)

    def batch(self, picked: list[int]):
        """These sequences, right-padded: ids (B, W), features (B, W, D) fp32, valid (B, W)."""
        width = max(len(self.seqs[i]) for i in picked)
        ids = torch.zeros(len(picked), width, dtype=torch.long)
        feats = torch.zeros(len(picked), width, self.feats.shape[1])
        valid = torch.zeros(len(picked), width, dtype=torch.bool)
        for row, i in enumerate(picked):
            n = len(self.seqs[i])
            ids[row, :n] = torch.tensor(self.seqs[i])
            feats[row, :n] = self.feats[self.offsets[i]:self.offsets[i] + n].float()
            valid[row, self.starts[i] if self.starts else 0:n] = True
        return ids, feats, valid


FEATURE_BATCH = 8  # sequences per target forward in the feature pass,
FEATURE_TOKENS = 2048  # and padded tokens (its activations: every layer's hidden states are returned)
# and for the EAGLE tree
