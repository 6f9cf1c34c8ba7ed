"""Experiment (README, "A larger draft vocabulary without retraining"): the shipped EAGLE-3's chained top-1
agreement with the target's full-vocabulary argmax on held-out answers, when its head reads K of the target's rows
(the shipped 8192, then the next most frequent training tokens). Needs out/train/eagle3-all (its held-out features)
and a folder CHUNKS of chunks 0-43 of assets/distill/prompts (the data that drafter saw):
    .venv/bin/python experiments/probes/vocab_sweep.py CHUNKS > experiments/results/vocab_sweep.txt"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz import paths  # noqa: E402
from specviz.core import answers  # noqa: E402
from specviz.drafters import trained as drafters  # noqa: E402
from specviz.models import loader as models  # noqa: E402
from specviz.train import distill, features, losses  # noqa: E402
from specviz.train.loop import HELD_LENGTH  # noqa: E402

torch.set_num_threads(1)
target = models.get("smollm2-135m", torch.device("cpu"), torch.bfloat16)
folder = paths.DRAFTERS / "smollm2-135m-eagle"
dr = drafters.load(folder, target)
module = dr.module.float().eval()
examples = answers.read_examples(answers.ORIGINAL) + answers.read_chunks(sys.argv[1])
tr, held = distill.split(examples)
seqs = list(distill.sequences(tr))
counts = torch.zeros(49152, dtype=torch.long)
for s in seqs:
    counts += torch.bincount(torch.tensor(s), minlength=49152)
shipped = dr.vocab_ids.cpu()
order = torch.argsort(counts, descending=True, stable=True)
mask = torch.ones(49152, dtype=torch.bool)
mask[shipped] = False
ext = torch.cat([shipped, order[mask[order]]])
saved = torch.load(paths.REPO / "out/train/eagle3-all/held_out_features.pt", weights_only=True, mmap=True)
hf = saved["features"]
hseqs = list(distill.sequences(held))
scored = [i for i, s in enumerate(hseqs) if len(s) <= HELD_LENGTH][:256]
ids, f, valid = features.Batches(hseqs, hf, 0, 0).batch(scored)
for row, i in enumerate(scored):
    valid[row, :len(held[i]["prompt_ids"])] = False
W = target.model.get_output_embeddings().weight.detach().float()
Ks = [8192, 12288, 16384, 24576, 32768, 49152]
rec = []
orig = losses.head_kl
def spy(pred, true, head, mask=None, ranks=1):
    q = pred.float() @ W.T
    t = true.float() @ W.T
    rec.append((t.argmax(-1), q.topk(256, -1).indices))
    return orig(pred, true, head, mask, ranks)
losses.head_kl = spy  # eagle_loss looks head_kl up in its own module
with torch.no_grad():
    losses.eagle_loss(module, W[shipped], target.model.get_input_embeddings(), ids, f.float(), valid, 0.0, unroll=4)
t = f.shape[1] - 1
rank_of = torch.full((49152,), 10**9, dtype=torch.long)
rank_of[ext] = torch.arange(49152)
res = {}
for K in Ks:
    alive = torch.ones(valid.shape[0], t, dtype=torch.bool)
    accs = []
    for step, (t_top, top) in enumerate(rec):
        m = torch.nn.functional.pad(valid[:, 1 + step:], (0, step))
        inK = rank_of[top] < K
        first = inK.float().argmax(-1)
        pick = top[torch.arange(len(top)), first]
        hit = pick == t_top
        live = alive[m]
        accs.append(round(float(hit[live].float().mean()), 4))
        alive = alive & m
        alive[m] = live & hit
    cover = float((rank_of[rec[0][0]] < K).float().mean())
    res[K] = {"chain_top1_by_depth": accs, "coverage_of_target_argmax": round(cover, 4)}
    print(K, res[K], flush=True)
