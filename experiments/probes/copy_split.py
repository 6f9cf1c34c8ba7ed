"""Does EAGLE copy? Its teacher-forced depth-1 top-1 on the target's answers (what its first draft would be, given
the target's true features: inside the engine the same, checked on 3 questions), split by whether the longest
earlier match of a 3..6-token suffix predicts the true next token ("copy": the answer repeats its context there),
predicts another ("copy_wrong") or none ("other").
Usage: .venv/bin/python experiments/probes/copy_split.py ANSWERS.json [DRAFTER]
ANSWERS: a JSON list of {category, prompt_ids, answer_ids} (experiments/probes/ar_answers.py writes Spec-Bench's)."""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz import paths  # noqa: E402
from specviz.drafters import trained as drafters  # noqa: E402
from specviz.models import loader as models  # noqa: E402

target = models.get()  # the default target in this device's default dtype (on a CPU what `bench` loads)
folder = sys.argv[2] if len(sys.argv) > 2 else paths.DRAFTERS / "smollm2-135m-eagle"
d = drafters.load(folder, target)
layers = tuple(d.cfg.feature_layers)
dec = target.model.get_decoder()
data = json.load(open(sys.argv[1]))
def copy_pred(seq, i, nmin=3, nmax=6):
    # token predicted after seq[:i] by the longest suffix (len nmin..nmax) seen earlier; None if none
    for n in range(nmax, nmin - 1, -1):
        if i < n:
            continue
        suf = seq[i - n:i]
        for j in range(i - n - 1, -1, -1):
            if seq[j:j + n] == suf:
                return seq[j + n]
    return None
tot = {"copy": [0, 0], "other": [0, 0], "copy_wrong": [0, 0]}
percat = {}
for ex in data:
    ids, ans = ex["prompt_ids"], ex["answer_ids"]
    seq = ids + ans
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = dec(input_ids=torch.tensor([seq]), output_hidden_states=True)
    fused = torch.cat([out.hidden_states[k][0] for k in layers], -1).to(torch.float16)
    with torch.inference_mode():
        m = d.module
        T = len(seq)
        o, _ = m(m.lift(d.inputs(fused[:-1][None])), d.embed(torch.tensor(seq[1:]))[None], torch.arange(T - 1))
        dids = d.to_target_ids(d.logits(o[0]).argmax(-1))[:-1].tolist()  # row i predicts seq[i+2]
    P = len(ids)
    c = percat.setdefault(ex["category"], [0, 0, 0, 0])
    for pos in range(max(P, 2), T):  # answer token at pos, predicted by row pos-2
        hit = dids[pos - 2] == seq[pos]
        cp = copy_pred(seq, pos)
        k = "other" if cp is None else ("copy" if cp == seq[pos] else "copy_wrong")
        tot[k][0] += hit
        tot[k][1] += 1
        if k == "copy":
            c[0] += hit
            c[1] += 1
        else:
            c[2] += hit
            c[3] += 1
allh = sum(v[0] for v in tot.values())
alln = sum(v[1] for v in tot.values())
print(f"all: top1 {allh/alln:.3f} over {alln}")
for k, (h, n) in tot.items():
    print(f"{k}: top1 {h/max(n,1):.3f} over {n} ({n/alln:.1%} of positions)")
for cat, (a, b, e, f) in percat.items():
    print(f"  {cat:15s} copy {a}/{b}  other {e}/{f}")
