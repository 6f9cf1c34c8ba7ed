"""EAGLE inside the engine against teacher forcing, per Spec-Bench question: the acceptance of its first draft each
step (its 3-node tree, greedy) and its top-1 on the same answer given the target's true features in one forward.
Usage: .venv/bin/python experiments/probes/engine_vs_teacher.py QUESTION_ID ..."""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz import engines, paths  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.drafters import trained as drafters  # noqa: E402
from specviz.engines.eagle import eagle_tree_engine  # noqa: E402
from specviz.models import loader as models  # noqa: E402

target = models.get()  # the default target in this device's default dtype (on a CPU what `bench` loads)
qs = {json.loads(line)["question_id"]: json.loads(line) for line in open(paths.SPEC_BENCH)}
d = drafters.load(paths.DRAFTERS / "smollm2-135m-eagle", target)
eng = eagle_tree_engine(target, d)
cfg = DecodeConfig(method="eagle", max_new_tokens=128)
layers = tuple(d.cfg.feature_layers)
dec = target.model.get_decoder()
D = d.cfg.hidden_size
for qid in map(int, sys.argv[1:]):
    ids = target.encode_prompt(qs[qid]["turns"][0])
    run = engines.generate(eng, ids, cfg)
    ans = [t for e in run.events for t in [x.token_id for x in e.emitted]]
    # engine depth-1 rank-0 acceptance
    d1 = [x for e in run.events for x in e.drafts if x.depth == 0 and x.rank == 0]
    eng_acc = sum(x.verdict.value == "accepted" for x in d1) / max(1, len(d1))
    seq = ids + ans
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = dec(input_ids=torch.tensor([seq]), output_hidden_states=True)
    fused = torch.cat([out.hidden_states[k][0] for k in layers], -1).to(torch.float16)
    final = out.last_hidden_state[0]
    with torch.inference_mode():
        m = d.module
        T = len(seq)
        o, _ = m(m.lift(d.inputs(fused[:-1][None])), d.embed(torch.tensor(seq[1:]))[None], torch.arange(T - 1))
        pred = d.logits(o[0])  # (T-1, V') predicts token i+2
        dids = d.to_target_ids(pred.argmax(-1))[:-1]
        tgt = torch.tensor(seq[2:])
        P = len(ids)
        hit = (dids[P - 2:] == tgt[P - 2:]).float()  # predictions of answer tokens
        # target's own argmax check
        tl = (target.model.lm_head.weight.float() @ final.float().T).T.argmax(-1)
        tgt_self = (tl[P-1:-1] == torch.tensor(seq[P:])).float().mean().item()
    print(f"q{qid}: answer {len(ans)} engine depth1 rank0 acc {eng_acc:.3f} over {len(d1)}; "
          f"teacher-forced top1 {hit.mean().item():.3f} over {len(hit)}; target self-consistency {tgt_self:.3f}")
