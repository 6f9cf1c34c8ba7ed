"""Why llama.cpp's speculative greedy answer can differ from its own plain one (Spec-Bench 81): its logits depend on
how many tokens a forward evaluates. A plain llama-server on the fp32 target export decodes the answer one token at a
time (top-2 log-probs at each step); then the same prefix, up to the step where the served speculative answer left
the plain one, is evaluated as a prompt (one batched forward, as verification evaluates its drafts) and its next
token's top-2 compared. If the two orders differ at a near tie, speculation is not at fault: the engine's numerics are
not batch-invariant.

    python experiments/probes/llama_batch_flip.py [--question 81] [--prefix "As I stepped off the plane"]
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specviz.paths import SPEC_BENCH  # noqa: E402
from specviz.serving import engine_export, server  # noqa: E402


def post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=300).read())


def top2(entry: dict) -> list[tuple[str, float]]:
    return [(x["token"], round(x["logprob"], 5)) for x in entry["top_logprobs"][:2]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--question", type=int, default=81)
    ap.add_argument("--prefix", default="As I stepped off the plane", help="the answer up to the step that flipped")
    ap.add_argument("--tokens", type=int, default=12)
    args = ap.parse_args()
    question = next(json.loads(line) for line in open(SPEC_BENCH) if json.loads(line)["question_id"] == args.question)
    target = engine_export.export_target("smollm2-135m", log=lambda _: None) / engine_export.TARGET_GGUF
    flags = ["--ctx-size", "4096", "--parallel", "1", "--threads", "2", "--seed", "0"]
    with server.LlamaServer(target, flags) as srv:
        prompt = post(srv.url, "/apply-template", {"messages": [{"role": "user", "content": question["turns"][0]}]})[
            "prompt"]
        step = post(srv.url, "/completion", {"prompt": prompt, "n_predict": args.tokens, "temperature": 0,
                                             "n_probs": 2, "cache_prompt": False})
        print(f"llama-server {target}, Spec-Bench {args.question}, greedy")
        print(f"one token a forward: {step['content']!r}")
        for e in step["completion_probabilities"]:
            (a, la), (b, lb) = top2(e)
            print(f"  {e['token']!r:14} top-2 {a!r} {la} / {b!r} {lb}  gap {la - lb:.5f}")
        batch = post(srv.url, "/completion", {"prompt": prompt + args.prefix, "n_predict": 1, "temperature": 0,
                                              "n_probs": 2, "cache_prompt": False})
        (a, la), (b, lb) = top2(batch["completion_probabilities"][0])
        print(f"the prefix {args.prefix!r} in one batched forward: next top-2 {a!r} {la} / {b!r} {lb}  "
              f"gap {la - lb:.5f}")


if __name__ == "__main__":
    main()
