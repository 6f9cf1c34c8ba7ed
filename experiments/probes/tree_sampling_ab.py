"""Experiment (issue 33, docs/exactness.md "Chosen or drawn siblings?"): at temperature > 0, does EAGLE's tree
accept more with its top-ranked children verified as point masses (what the tree engine does) or with siblings drawn
from the drafter's q without replacement (each verified against the distribution it came from)? Both verify exactly
(core/sampling.verify_tree); τ decides. Also the chain EAGLE verified before tree sampling (one draw per position),
and each tree with prompt lookup's and the datastore's branches (the default race). Spec-Bench questions round-robin
over categories, one seed per question, τ = tokens / target forwards (the prefill included, as metrics count it):
    .venv/bin/python experiments/probes/tree_sampling_ab.py --limit 6 --max-new-tokens 64 \
        > experiments/results/tree_sampling_ab.txt"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz import engines, metrics, prompts  # noqa: E402
from specviz.config import DecodeConfig  # noqa: E402
from specviz.core.sampling import draw_siblings, warp  # noqa: E402
from specviz.core.trees import Tree  # noqa: E402
from specviz.engines.eagle import EagleProposer  # noqa: E402
from specviz.engines.speculative import SpeculativeEngine  # noqa: E402
from specviz.engines.tree import TreeEngine, TreeProposal  # noqa: E402
from specviz.models import loader as models  # noqa: E402

QUESTIONS = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"


class DrawnSiblingsProposer(EagleProposer):
    """EAGLE's static tree with each node's children drawn from the drafter's warped q without replacement (the
    k-th draw from q without the earlier ones) instead of taken from its ranking; a node whose parent drew fewer
    distinct tokens than its rank (q's support is small after top-p) is left out with its subtree."""

    @torch.inference_mode()
    def propose(self, state, tokens, tree, cfg, room, generator):
        if cfg.greedy:
            return super().propose(state, tokens, tree, cfg, room, generator)
        root = state.context(tokens)
        if root is None:
            return None
        feat = root[0]
        paths = [p for p in tree.paths if len(p) <= room]
        node_feat = {(): feat}  # the predicted feature each drawn node's children come from
        chosen: dict[tuple, tuple[int, torch.Tensor]] = {}  # path -> (draft-vocabulary index, q it was drawn from)
        kv, fed, forwards = state.kv, [], 0
        for depth in range(1, max(len(p) for p in paths) + 1):
            level = [p for p in paths if len(p) == depth and (depth == 1 or p[:-1] in chosen)]
            for parent in sorted({p[:-1] for p in level}):
                probs = warp(self.d.logits(node_feat[parent]).float().cpu(), cfg)  # (N,)
                kids = [p for p in level if p[:-1] == parent]
                draws, qs = draw_siblings(probs, 1 + max(p[-1] for p in kids), generator)
                for p in kids:
                    if p[-1] < len(draws):
                        chosen[p] = (draws[p[-1]], qs[p[-1]])
            grow = [p for p in level if p in chosen and any(len(c) == depth + 1 and c[:-1] == p for c in paths)]
            if not grow:
                break
            ids = self.d.to_target_ids(torch.tensor([chosen[p][0] for p in grow]))
            inputs = torch.stack([node_feat[p[:-1]] for p in grow])
            visible = torch.tensor([[p[:len(c)] == c for c in fed + grow] for p in grow])  # ancestors and itself
            out, kv = state.feed_nodes(kv, inputs, ids, visible, depth)
            forwards += 1
            for row, p in enumerate(grow):
                node_feat[p] = out[row]
            fed += grow
        drawn = Tree.from_choices(list(chosen))
        small = torch.tensor([chosen[p][0] for p in drawn.paths])
        return TreeProposal(drawn, [int(t) for t in self.d.to_target_ids(small).tolist()],
                            [float(chosen[p][1][chosen[p][0]]) for p in drawn.paths],
                            tuple(self.d.scatter(chosen[p][1]) for p in drawn.paths), forwards + 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.95)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    target = models.get("smollm2-135m", cpu, models.default_dtype(cpu))
    tree_engine: TreeEngine = engines.build("eagle", target)  # a TreeEngine for a tree drafter (asserted below)
    assert isinstance(tree_engine, TreeEngine)
    drawn_engine = TreeEngine("eagle", target, DrawnSiblingsProposer(tree_engine.proposer.d),
                              tree_engine.tree.paths)
    chain_engine = engines.build("eagle", target, chain=True)
    assert isinstance(chain_engine, SpeculativeEngine)
    rows = prompts.pick(prompts.read(QUESTIONS), limit=args.limit)
    base = DecodeConfig(method="eagle", temperature=args.temperature, top_p=args.top_p,
                        max_new_tokens=args.max_new_tokens)
    lanes = {
        "eagle chain (before)": (chain_engine, base.with_(gamma=5)),
        "eagle tree, top-ranked (point masses)": (tree_engine, base.with_(gamma=5)),
        "eagle tree, drawn siblings": (drawn_engine, base.with_(gamma=5)),
        "eagle dynamic tree, top-ranked": (tree_engine, base.with_(gamma=5, tree="dynamic")),
        "eagle+pld:6+ret:6, top-ranked": (tree_engine, base.with_(gamma=5, lookup=6, retrieve=6)),
        "eagle+pld:6+ret:6, drawn siblings": (drawn_engine, base.with_(gamma=5, lookup=6, retrieve=6)),
    }
    print(f"# {len(rows)} Spec-Bench questions, {args.max_new_tokens} new tokens, temperature {args.temperature}, "
          f"top-p {args.top_p}, seed = question index; target {target.name} {str(target.dtype).split('.')[-1]}; "
          f"EAGLE's static tree of {len(tree_engine.tree.paths)} nodes, γ 5")
    totals = {name: [0, 0, 0, 0] for name in lanes}  # tokens, forwards, accepted, judged
    start = time.perf_counter()
    for k, row in enumerate(rows):
        ids = target.encode_prompt(row["prompt"])
        line = [f"{k:2d} {row['category'][:14]:14s}"]
        for name, (engine, cfg) in lanes.items():
            s = metrics.summarize(name, list(engine.steps(ids, cfg.with_(seed=k))))
            t = totals[name]
            t[0] += s.new_tokens
            t[1] += s.steps
            t[2] += s.accepted
            t[3] += s.drafted
            line.append(f"{s.tau:5.2f}")
        print("  ".join(line), flush=True)
    print(f"# τ per question in the order: {' | '.join(lanes)}  ({time.perf_counter() - start:.0f} s)")
    for name, (tokens, forwards, accepted, judged) in totals.items():
        print(f"{name:40s} τ {tokens / forwards:.3f}  ({tokens} tokens / {forwards} target forwards; "
              f"accepted {accepted} of {judged} candidates judged)")


if __name__ == "__main__":
    main()
