"""Why a race's target forward of k rows costs more than the verify profile's T(k) (issue 51, item 2: the start line
within 10% of bench). The calibration found a verification of 3 rows at 1.25 AR steps and of 13 at 1.96 where the
profile's back-to-back forwards say 1.06 and 1.46 (tuning.measure_costs, experiments/LOG.md). Times, for k rows over a
context of --context cached tokens, the kernel threads as the app runs them, median of --reps, interleaved:

- profile: CachedLM.logits of k causal rows (the profile's call, back to back, as verify_profile times it);
- tree: CachedLM.tree_logits of the root and a chain of k - 1 nodes with EAGLE-3's three feature layers, then
  keep_path (what TreeEngine.verify runs), back to back;
- tree after work: the same after --work ms of Python work on one thread (a drafter's step between two forwards:
  the kernel threads sleep meanwhile);
- profile after work: the profile's call after the same work.

    .venv/bin/python experiments/probes/race_forward_excess.py [--context 200] [--work 1.5]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz.core.cache import CachedLM  # noqa: E402
from specviz.core.trees import Tree  # noqa: E402
from specviz.hardware import cpu_name  # noqa: E402
from specviz.models import kernels  # noqa: E402
from specviz.models.loader import load  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--context", type=int, default=200)
ap.add_argument("--work", type=float, default=1.5, help="ms of Python work before a forward (the *after work* rows)")
ap.add_argument("--reps", type=int, default=15)
ap.add_argument("--rows", default="1,3,5,8,13")
args = ap.parse_args()
target = load("smollm2-135m")
lm = CachedLM.of(target)
V = target.vocab_size
prefix = [(7 * i + 11) % V for i in range(args.context)]
features = (3, 15, 28)


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += 1


def profile_call(k: int) -> float:
    t0 = time.perf_counter()
    lm.logits(prefix, [(13 * j + 5) % V for j in range(k)], keep=k)
    dt = time.perf_counter() - t0
    lm.rollback(args.context)
    return dt


def tree_call(k: int) -> float:
    """k = 1: the root alone (a step without drafts), as the engines feed it."""
    tree = Tree.from_choices([tuple([0] * d) for d in range(1, k)]) if k > 1 else None
    nodes = [(13 * j + 5) % V for j in range(k - 1)]
    t0 = time.perf_counter()
    if tree is None:
        lm.logits(prefix + [17], features=features)
    else:
        lm.tree_logits(prefix + [17], tree, nodes, features=features)
        lm.keep_path(args.context + 1, [])
    dt = time.perf_counter() - t0
    lm.rollback(args.context)
    return dt


lm.logits(prefix)
rows = [int(k) for k in args.rows.split(",")]
ways = {"profile": lambda k: profile_call(k), "tree": lambda k: tree_call(k),
        "tree after work": lambda k: (busy(args.work), tree_call(k))[1],
        "profile after work": lambda k: (busy(args.work), profile_call(k))[1]}
times = {(w, k): [] for w in ways for k in rows}
for rep in range(args.reps + 1):
    for k in rows:
        for w, f in ways.items():
            t = f(k)
            if rep:
                times[w, k].append(t)
med = {key: statistics.median(v) * 1000 for key, v in times.items()}
print(f"# python experiments/probes/race_forward_excess.py --context {args.context} --work {args.work} "
      f"--reps {args.reps}")
print(f"# {cpu_name()}; {kernels.describe()}; {kernels.threads()} kernel threads; median ms (÷ the profile's k=1)")
print("| rows | " + " | ".join(ways) + " |")
print("|---|" + "---|" * len(ways))
base = med["profile", rows[0]]
for k in rows:
    print(f"| {k} | " + " | ".join(f"{med[w, k]:.2f} ({med[w, k] / base:.2f})" for w in ways) + " |")
