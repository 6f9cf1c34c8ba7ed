"""Experiment (README, "A larger draft vocabulary without retraining"): would adding a run's own tokens (the prompt
and what was generated so far) to the shipped EAGLE's 8192-token draft vocabulary help?
1. coverage: of the answer tokens of every 4th chunk of 0-43, the share in the vocabulary chosen from chunks 44-77
   (8192 or 16384 most frequent), without and with the context's tokens (a count over the committed ids);
2. acceptance: the shipped EAGLE's teacher-forced top-1 against the target's greedy token on every 3rd held-out
   answer of chunks 44-77, its head over the 8192, the 8192 plus the context's tokens, or all 49152 rows. Needs
   out/train/eagle-more (its cached held-out features: the second EAGLE run of `make drafters`);
3. the cost of one row through a bf16 head of N rows.
    .venv/bin/python experiments/probes/context_vocab.py > experiments/results/context_vocab.txt"""
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz import paths  # noqa: E402
from specviz.core import answers  # noqa: E402
from specviz.drafters import trained as drafters  # noqa: E402
from specviz.models import loader as models  # noqa: E402
from specviz.train import distill, features  # noqa: E402

torch.set_num_threads(2)
def chunks(r):
    return [e for c in r for e in answers.read_examples(answers.PROMPTS_OUT / f"chunk-{c:05d}.jsonl.gz")]
later, earlier = chunks(range(44, 78)), chunks(range(0, 44, 4))
seqs = list(distill.sequences(later))
for n in (8192, 16384):
    vocab = set(drafters.frequent_vocab(seqs, 49152, n).tolist())
    total = static = with_context = 0
    for e in earlier:
        seen = set(e["prompt_ids"])
        for t in e["answer_ids"]:
            total, static, with_context = total + 1, static + (t in vocab), with_context + (t in vocab or t in seen)
            seen.add(t)
    print(f"coverage, {n} tokens: {static / total:.4f}, with the context's tokens {with_context / total:.4f} "
          f"({total} answer tokens)")

target = models.load("smollm2-135m")
d = drafters.load(paths.DRAFTERS / "smollm2-135m-eagle", target)
_, held = distill.split(later)
hseqs = list(distill.sequences(held))
more = paths.REPO / "out/train/eagle-more"
meta = json.load(open(more / "held_out_features.f16.json"))
assert meta["n"] == len(hseqs) and meta["rows"] == sum(map(len, hseqs)), "out/train/eagle-more holds other data"
feats = torch.from_file(str(more / "held_out_features.f16"), size=meta["rows"] * meta["width"],
                        dtype=torch.float16).view(meta["rows"], meta["width"])
offsets, d_model = features.offsets_of(hseqs), target.model.config.hidden_size
head = target.model.get_output_embeddings().weight
static = torch.zeros(head.shape[0], dtype=torch.bool)
static[d.vocab_ids.cpu()] = True
m, n, hits = d.module, 0, {"8192": 0, "8192 + context": 0, "49152": 0}
with torch.inference_mode():
    for k in range(0, len(hseqs), 3):
        s, P = hseqs[k], len(held[k]["prompt_ids"])
        f = d.inputs(feats[offsets[k]:offsets[k + 1], d_model:])  # the fused features after [final | fused]
        ids = torch.tensor(s)
        out, _ = m(m.lift(f[None, :len(s) - 2]), d.embed(ids[1:len(s) - 1])[None], torch.arange(len(s) - 2), None)
        logits = torch.nn.functional.linear(m.readout(out[0]).to(head.dtype), head).float()  # row i predicts s[i + 2]
        for i in range(P - 2, len(s) - 2):
            context = torch.zeros_like(static)
            context[ids[:i + 2]] = True
            row, truth = logits[i], s[i + 2]
            for name, allowed in (("8192", static), ("8192 + context", static | context), ("49152", None)):
                hits[name] += int((row if allowed is None else torch.where(allowed, row, -1e9)).argmax()) == truth
            n += 1
print(f"teacher-forced top-1 of the shipped EAGLE, {len(range(0, len(hseqs), 3))} held-out answers, {n} positions: "
      + ", ".join(f"{k} {v / n:.4f}" for k, v in hits.items()))

x = torch.randn(1, d_model).bfloat16()
for rows in (8192, 16384, 20480, 24576, 49152):
    w = head[:rows].contiguous()
    for _ in range(20):
        torch.nn.functional.linear(x, w)
    t0 = time.perf_counter()
    for _ in range(200):
        torch.nn.functional.linear(x, w)
    print(f"one row through a bf16 head of {rows} rows: {(time.perf_counter() - t0) / 200 * 1000:.2f} ms")
