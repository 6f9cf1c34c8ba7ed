"""The target's greedy answers to the first 48 Spec-Bench questions (128 new tokens, bf16), as prompt and answer ids,
for experiments/probes/copy_split.py and vocab_size.py.
Usage: .venv/bin/python experiments/probes/ar_answers.py OUT.json"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz import engines, paths  # noqa: E402
from specviz.cli.bench import read_prompts  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.models import loader as models  # noqa: E402

target = models.get()  # the default target in this device's default dtype (on a CPU what `bench` loads)
prompts = read_prompts(str(paths.SPEC_BENCH), None, 48)
eng = engines.build("ar", target)
cfg = DecodeConfig(method="ar", max_new_tokens=128)
out = []
for r in prompts:
    ids = target.encode_prompt(r["prompt"])
    run = engines.generate(eng, ids, cfg)
    out.append({"id": r.get("id"), "category": r.get("category"), "prompt_ids": ids, "answer_ids": list(run.token_ids)})
json.dump(out, open(sys.argv[1], "w"))
print(len(out), sum(len(o["answer_ids"]) for o in out))
