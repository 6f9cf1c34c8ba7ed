"""What a step verifying many rows costs, part by part (issue 51): where cheap rows (an AMX host) make 16-64 verified
rows worth it, the parts that do not shrink with them (attention over the cached tokens, the tree's bookkeeping, the
verification glue) must stay small. For 1, 8, 16, 32 and 64 rows (the root and a tree of k − 1 nodes, 4 children a
node, breadth first: EAGLE-2's shape) after a 256-token prefill, median of --reps, each part alone:

- step: the target's tree forward (CachedLM.tree_logits: embed, the fused layers, norm, head, bookkeeping), the greedy
  verification (warp, argmax, walk, the nodes' verdicts) and the cache keeping the accepted path (keep_path): what
  TreeEngine.verify does a step;
- matmuls: the 30 layers' four packed matmuls (QKV, O, gate+up, down) and the LM head over k rows, alone;
- attention: attend.c over 256 + k cached keys for k rows (9 heads over 3 key/value heads) × 30 layers, alone;
- mask: the tree's visible slots and positions (trees.tree_visible) and keeping the path (keep_path);
- glue, greedy: the rows the walk reaches warped (a softmax each) and their argmax, greedy_walk, tree_verdicts;
  glue, sampled (temperature 0.7, top-p 0.95): WarpedRows, verify_tree, tree_verdicts; and, for the A/B, the greedy
  glue as it was (a softmax over every row, then every row's argmax: "dense (before)");
- rest: the step less matmuls, attention, mask and greedy glue (embedding, RoPE, norms, the activation, Python).

    .venv/bin/python experiments/probes/many_rows.py [--threads 1] > experiments/results/many_rows-zen4.txt
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from timing import median_seconds  # noqa: E402  (beside this file)

from specviz.config import DecodeConfig  # noqa: E402
from specviz.core.cache import CachedLM  # noqa: E402
from specviz.core.sampling import WarpedRows, argmax_rows, verify_tree, warp  # noqa: E402
from specviz.core.trees import Tree, greedy_walk, tree_visible  # noqa: E402
from specviz.engines.tree import RowArgmax, TreeProposal, tree_verdicts  # noqa: E402
from specviz.models import fused as fused_mod  # noqa: E402
from specviz.models import kernels  # noqa: E402
from specviz.models.loader import load  # noqa: E402

PREFILL = 256
SIZES = (1, 8, 16, 32, 64)
GREEDY, SAMPLED = DecodeConfig(), DecodeConfig(temperature=0.7, top_p=0.95)


def eagle2_tree(nodes: int) -> Tree:
    """nodes nodes of a 4-ary tree, breadth first."""
    paths, frontier = [], [()]
    while len(paths) < nodes:
        nxt = []
        for p in frontier:
            for r in range(4):
                if len(paths) < nodes:
                    paths.append(p + (r,))
                    nxt.append(p + (r,))
        frontier = nxt
    return Tree.from_choices(paths)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2, help="torch's and the kernels' (1 on a shared, loaded host: a "
                    "part's many small multi-threaded calls each wait at a barrier for a descheduled thread)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["SPECVIZ_KERNEL_THREADS"] = str(args.threads)
    ms = lambda f: 1000 * median_seconds(f, args.reps, warmup=3)  # noqa: E731
    target = load("smollm2-135m")
    lm, fused = CachedLM.of(target), target.fused
    context = list(range(1000, 1000 + PREFILL))
    lm.logits(context[:-1], keep=1)  # the prefill: the last context token is the step's root
    n_ctx = len(context)
    matmuls = [m for layer in range(fused.n_layers) for m in fused.matmuls(layer)]
    heads, kv_heads, head_dim = fused.heads, fused.kv_heads, fused.head_dim
    text_of = target.text_of
    rows = []
    for k in SIZES:
        tree = eagle2_tree(max(k - 1, 1))  # k = 1: AR's step (no tree; its parts below)
        node_tokens = [7 + i for i in range(tree.size)]
        prop = TreeProposal(tree, node_tokens, [0.5] * tree.size, None, 1)
        x = torch.randn(k, fused.d).to(torch.bfloat16)
        normed = fused.norm(x)
        xs = {inputs: torch.randn(k, inputs).to(torch.bfloat16) for _, _, inputs in matmuls}
        logits = torch.randn(k, target.vocab_size) * 4

        def forward():
            lm.rollback(n_ctx - 1)
            return lm.tree_logits(context, tree, node_tokens) if k > 1 else lm.logits(context, keep=1)

        def glue_dense(lg=logits):  # TreeEngine.verify's greedy glue before many_rows.py: every row's softmax
            p_rows = warp(lg, GREEDY)
            if k == 1:
                return argmax_rows(p_rows)
            path, nxt = greedy_walk(tree, node_tokens, argmax_rows(p_rows))
            return tree_verdicts(prop, p_rows, path, bool(tree.children(path[-1] if path else -1)), None, text_of)

        def glue_greedy(lg=logits):  # now: the rows the walk reaches
            p_rows = WarpedRows(lg, GREEDY)
            if k == 1:
                return RowArgmax(p_rows)[0]
            path, nxt = greedy_walk(tree, node_tokens, RowArgmax(p_rows))
            return tree_verdicts(prop, p_rows, path, bool(tree.children(path[-1] if path else -1)), None, text_of)

        gen = torch.Generator().manual_seed(0)

        def glue_sampled(lg=logits):
            p_rows = WarpedRows(lg, SAMPLED)
            if k == 1:
                return p_rows[0]
            result = verify_tree(tree.parents, node_tokens, None, p_rows, gen)
            return tree_verdicts(prop, p_rows, result.path, result.rejected, result, text_of)

        def step():
            lg = forward()[:, :target.vocab_size]
            glue_greedy(lg)
            if k > 1:
                lm.keep_path(n_ctx, [])

        def mask():
            if k > 1:
                tree_visible(n_ctx, 1, tree)
                lm.keep_path(n_ctx, [])

        def mm():
            for packed, n, inputs in matmuls:
                fused_mod.linear_packed(xs[inputs], packed, n)
            fused.head(normed)

        kv = n_ctx + k
        q = torch.randn(k, heads, head_dim)
        key = torch.randn(kv_heads, kv, head_dim).to(torch.bfloat16)
        value = torch.randn(kv_heads, kv, head_dim).to(torch.bfloat16)
        index = torch.cat([torch.arange(n_ctx + i, dtype=torch.int32) for i in range(k)])  # causal: an upper bound
        offsets = torch.tensor([0] + [sum(n_ctx + j for j in range(i + 1)) for i in range(k)], dtype=torch.int64)

        def attn():
            for _ in range(fused.n_layers):
                kernels.attend(q, key, value, index, offsets, head_dim ** -0.5)

        parts = {"step": ms(step), "matmuls": ms(mm), "attention": ms(attn), "mask": ms(mask),
                 "glue, greedy": ms(glue_greedy), "glue, sampled": ms(glue_sampled),
                 "glue, greedy, dense (before)": ms(glue_dense)}
        parts["rest"] = parts["step"] - sum(parts[p] for p in ("matmuls", "attention", "mask", "glue, greedy"))
        rows.append((k, parts))
        lm.rollback(n_ctx - 1)
    names = list(rows[0][1])
    print(f"# {kernels.describe()}; {args.threads} threads; {PREFILL} cached tokens; median of {args.reps}; "
          "ms (share of the step)")
    print("| rows | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for k, parts in rows:
        print(f"| {k} | " + " | ".join(f"{parts[n]:.2f} ({parts[n] / parts['step']:.0%})" for n in names) + " |")
    k32 = dict(rows)[32]
    over = [n for n in names if n not in ("step", "glue, greedy, dense (before)") and k32[n] > 0.1 * k32["step"]]
    print(f"\nover 10% of the step at 32 rows: {', '.join(over) or 'none'}")


if __name__ == "__main__":
    main()
