"""Does each drafter a real engine serves accept as specviz's own run of it predicts? Every (engine, drafter) pair
`serve` supports, started as `serve` starts it, probed with `probe --reference --local` on the same prompts: the
served and local acceptance by position, greedy identity against the same engine without speculation, the verdict.
Needs `make vllm` and `make server`; the probe JSONs go to --out.

    python experiments/probes/serve_probe.py --prompts ../shared/data/spec_bench/question.jsonl --limit 8 \
        --out experiments/results/serve_probe > experiments/results/serve_probe.txt
"""
import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specviz.cli.main import main as cli  # noqa: E402
from specviz.serving import engines  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default="experiments/results/serve_probe")
    ap.add_argument("--engines", default="vllm,llama.cpp")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"# {' '.join(sys.argv)}\n# {args.limit} prompts, {args.max_new_tokens} tokens, greedy, γ {engines.GAMMA}")
    print("| engine | drafter | served by position | local by position | largest gap | identical | verdict |")
    print("|---|---|---|---|---|---|---|")
    for engine in args.engines.split(","):
        with engines.Engine(engines.reference(engine, log=lambda _: None)) as reference:
            for drafter in engines.DRAFTERS[engine]:
                path = out / f"{engine}-{drafter}.json"
                with engines.Engine(engines.plan(engine, drafter, log=lambda _: None)) as served, \
                        contextlib.redirect_stdout(io.StringIO()):
                    cli(["probe", served.url, "--prompts", args.prompts, "--limit", str(args.limit),
                         "--max-new-tokens", str(args.max_new_tokens), "--temperature", "0", "--reference",
                         reference.url, "--local", "--drafter", drafter, "--json", str(path)])
                d = json.loads(path.read_text())
                c = d["comparison"]
                row = [engine, drafter, " ".join(f"{a:.2f}" for a in d["served"]["per_position"]),
                       " ".join(f"{a:.2f}" for a in d["local"]["per_position"]),
                       f"{c['largest']['gap']:+.2f} at {c['largest']['position']}" if c["largest"] else "-",
                       f"{d['identity']['identical']}/{d['identity']['compared']}",
                       c["verdict"].split(": ", 1)[-1]]
                print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
