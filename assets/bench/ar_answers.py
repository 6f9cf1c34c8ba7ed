"""The target's greedy answers to the first 48 Spec-Bench questions (128 new tokens, bf16), as prompt and answer ids,
for assets/bench/copy_split.py. Usage: PYTHONPATH=. python assets/bench/ar_answers.py OUT.json"""
import sys
import json, torch
from specviz.cli import main as cli
from specviz import engines
p = cli.parser().parse_args(["bench","--prompts","../shared/data/spec_bench/question.jsonl","--json","/dev/null"])
cli._default_pair(p); target = cli._target(p)
prompts = cli.read_prompts("../shared/data/spec_bench/question.jsonl", None, 48)
eng = engines.build("ar", target)
cfg = cli._config(p, "ar", {}).with_(max_new_tokens=128)
out = []
for r in prompts:
    ids = target.encode_prompt(r["prompt"])
    run = engines.generate(eng, ids, cfg)
    out.append({"id": r.get("id"), "category": r.get("category"), "prompt_ids": ids, "answer_ids": list(run.token_ids)})
json.dump(out, open(sys.argv[1], "w"))
print(len(out), sum(len(o["answer_ids"]) for o in out))
