"""How large a draft vocabulary EAGLE needs: for each size N (the N tokens most frequent in the target's answers in
assets/distill/prompts), the share of the target's Spec-Bench answer tokens it holds, and the drafter's teacher-forced
depth-1 top-1 when its hidden state is read through those N rows of the target's head (the drafter has no head of its
own, so any N can be read without new weights); then the same through its own vocabulary, and what the tokens outside
that vocabulary are (how many prompt lookup predicts, how many occur earlier in the context).
Usage: .venv/bin/python experiments/probes/vocab_size.py ANSWERS.json [DRAFTER]
ANSWERS: experiments/probes/ar_answers.py's output (the target's greedy answers to 48 Spec-Bench questions)."""
import gzip
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz import paths  # noqa: E402
from specviz.core.lookup import lookup  # noqa: E402
from specviz.drafters import trained as drafters  # noqa: E402
from specviz.models import loader as models  # noqa: E402

target = models.get()  # the default target in this device's default dtype (on a CPU what `bench` loads)
d = drafters.load(sys.argv[2] if len(sys.argv) > 2 else paths.DRAFTERS / "smollm2-135m-eagle", target)
V = target.vocab_size
counts = torch.zeros(V, dtype=torch.long)
for f in sorted((paths.DISTILL / "prompts").glob("chunk-*.jsonl.gz")):
    for line in gzip.open(f, "rt"):
        counts += torch.bincount(torch.tensor(json.loads(line)["answer_ids"], dtype=torch.long), minlength=V)
order = sorted(range(V), key=lambda i: (-int(counts[i]), i))
data = json.load(open(sys.argv[1]))
layers = tuple(d.cfg.feature_layers)
dec = target.model.get_decoder()
rows, truth, looked, seen = [], [], [], []
for ex in data:  # the drafter's readout rows given the target's true features, and the token each should predict
    seq = ex["prompt_ids"] + ex["answer_ids"]
    P, T = len(ex["prompt_ids"]), len(seq)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = dec(input_ids=torch.tensor([seq]), output_hidden_states=True)
    fused = torch.cat([out.hidden_states[k][0] for k in layers], -1)
    with torch.inference_mode():
        m = d.module
        o, _ = m(m.lift(d.inputs(fused[:-1][None])), d.embed(torch.tensor(seq[1:]))[None], torch.arange(T - 1))
        r = m.readout(o[0].reshape(-1, o.shape[-1]))  # row i predicts seq[i + 2]
    for pos in range(max(P, 2), T):
        rows.append(r[pos - 2].float())
        truth.append(seq[pos])
        looked.append(lookup(seq[:pos], 1, 3, 1) == [seq[pos]])  # prompt lookup's rule with its defaults (n 1..3)
        seen.append(seq[pos] in seq[:pos])
rows, truth, looked, seen = torch.stack(rows), torch.tensor(truth), torch.tensor(looked), torch.tensor(seen)
W = target.model.get_output_embeddings().weight.detach().float()
own = d.vocab_ids.cpu() if d.vocab_ids is not None else None
print(f"{len(truth)} answer tokens; the drafter's vocabulary {0 if own is None else len(own)}, "
      f"coverage {drafters.coverage(own, truth.tolist()) or 1.0:.4f}")
print(f"{'N':>6} {'coverage':>9} {'top-1':>6}")
for n in (8192, 12288, 16384, 20480, 24576, 32768, V):
    ids = torch.tensor(sorted(order[:n]))
    with torch.inference_mode():
        top = ids[(rows @ W[ids].T).argmax(-1)]
    print(f"{n:>6} {float(torch.isin(truth, ids).float().mean()):>9.4f} {float((top == truth).float().mean()):>6.3f}")
if own is not None:
    with torch.inference_mode():
        top = own[(rows @ W[own].T).argmax(-1)]
    print(f"its own vocabulary {float((top == truth).float().mean()):.3f}")
    out = ~torch.isin(truth, own)  # the tokens its vocabulary can never draft
    print(f"outside it: {int(out.sum())} tokens; prompt lookup (n 1..3) predicts "
          f"{float(looked[out].float().mean()):.3f} of them, {float(seen[out].float().mean()):.3f} occur earlier in "
          f"the context; the vocabulary or lookup holds {float((~out | looked).float().mean()):.4f} of all")
