"""Medusa: K heads on the target's last feature propose a candidate tree; the target verifies the whole
tree in one forward (4D mask, explicit positions, the stock model) and keeps the accepted path's KV.

The tree hangs off the last committed token (the root): head k proposes the nodes at depth k. Greedy
decoding walks the tree along the target's argmax, so the output equals plain greedy decoding. Sampling
is exact too: each head draws one token from its own (warped) distribution, and that chain is verified
with the same rejection rule as every chain drafter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from specviz.cache import CachedLM, clock
from specviz.config import DecodeConfig
from specviz.drafters import Drafter
from specviz.engines.base import commit
from specviz.events import DraftToken, StepEvent, Verdict
from specviz.models import LoadedModel
from specviz.sampling import pick, verify_chain, warp
from specviz.trees import Tree, greedy_walk

# A default for 2 CPU cores, where a 20-token forward costs ~1.5 AR steps: the top-1 chain four deep plus
# the runners-up that pay most often. Trained drafters store their own tree, chosen from measured head
# accuracies (python -m specviz train medusa).
DEFAULT_CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
                   (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0)]


@dataclass
class TreeRun:
    cfg: DecodeConfig
    target: CachedLM
    generator: torch.Generator
    prompt_len: int
    tokens: list[int]
    feature: torch.Tensor | None = None   # the target's feature of the last position it has seen
    step: int = 0
    finish_reason: str | None = None


class MedusaEngine:
    method = "medusa"

    def __init__(self, target: LoadedModel, drafter: Drafter, choices=None):
        self.target, self.d = target, drafter
        self.tree = Tree.from_choices(choices or drafter.cfg.tree or DEFAULT_CHOICES)
        self.tree = Tree.from_choices([p for p in self.tree.paths if len(p) <= drafter.cfg.medusa_heads])

    def steps(self, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[StepEvent]:
        run = self.start(prompt_ids, cfg)
        while run.finish_reason is None:
            yield self.cycle(run)

    def start(self, prompt_ids: list[int], cfg: DecodeConfig) -> TreeRun:
        return TreeRun(cfg, CachedLM(self.target.model, self.target.device), torch.Generator().manual_seed(cfg.seed),
                       len(prompt_ids), list(prompt_ids))

    @torch.inference_mode()
    def _heads(self, cfg: DecodeConfig, feature: torch.Tensor) -> torch.Tensor:
        """(K, N) each head's warped distribution over the draft vocabulary."""
        feats = self.d.module(feature[None].to(self.d.head_weight.device))[:, 0]  # (K, d)
        return torch.stack([warp(self.d.logits(f, head=k).float().cpu(), cfg) for k, f in enumerate(feats)])

    def cycle(self, run: TreeRun) -> StepEvent:
        cfg, tokens, vocab, text_of = run.cfg, run.tokens, self.target.vocab_size, self.target.text_of
        n_new = len(tokens) - run.prompt_len
        room = cfg.max_new_tokens - n_new - 1  # never draft past the length cap
        t0 = clock(self.target.device)
        if run.feature is None or room <= 0:
            tree, node_tokens, q_nodes = None, [], []
        else:
            q_heads = self._heads(cfg, run.feature)  # (K, N)
            if cfg.greedy:
                paths = [p for p in self.tree.paths if len(p) <= room]
                tree = Tree.from_choices(paths)
                ranked = torch.argsort(q_heads, dim=-1, descending=True)[:, :1 + max(tree.ranks)]  # (K, r)
                small = [int(ranked[tree.depths[i] - 1, tree.ranks[i]]) for i in range(tree.size)]
            else:  # exact sampling: one draw per head, verified as a chain
                tree = Tree.from_choices([(0,) * k for k in range(1, min(room, len(q_heads)) + 1)])
                small = [pick(q_heads[k], False, run.generator) for k in range(tree.size)]
            q_nodes = [float(q_heads[tree.depths[i] - 1, s]) for i, s in enumerate(small)]
            node_tokens = [int(t) for t in self.d.to_target_ids(torch.tensor(small)).tolist()]
        t1 = clock(self.target.device)
        n_ctx = len(tokens)
        n_fed = n_ctx - run.target.seen
        if tree is None:
            logits, hidden = run.target.logits(tokens, keep=1, features=True)
            p = warp(logits[0, :vocab], cfg)
            nxt = pick(p, cfg.greedy, run.generator)
            path, candidates, nodes = [], [(nxt, Verdict.PLAIN, float(p[nxt]))], []
            feature = hidden[-1]
        else:
            logits, hidden = run.target.tree_logits(tokens, tree, node_tokens, features=True)  # (1 + n, V)
            p_rows = warp(logits[:, :vocab], cfg)  # row 0: after the root; row i + 1: after node i
            if cfg.greedy:
                path, nxt = greedy_walk(tree, node_tokens, p_rows.argmax(-1).tolist())
                rejected = bool(tree.children(path[-1] if path else -1))
            else:
                q_full = self.d.scatter(q_heads[:tree.size])  # (k, V): node k was drawn from head k
                result = verify_chain(torch.tensor(node_tokens), q_full, p_rows, False, run.generator)
                path, nxt, rejected = list(range(result.n_accepted)), result.next_token, result.rejected
            last_row = path[-1] + 1 if path else 0
            kind = Verdict.RESAMPLED if rejected else Verdict.BONUS
            candidates = [(node_tokens[i], Verdict.ACCEPTED, float(p_rows[(tree.parents[i] + 1), node_tokens[i]]))
                          for i in path]
            candidates.append((nxt, kind, float(p_rows[last_row, nxt])))
            nodes = self._nodes(tree, node_tokens, q_nodes, p_rows, path, rejected)
            feature = hidden[n_fed - 1 + (path[-1] + 1 if path else 0)]
            run.target.keep_path(n_ctx, path)
        t2 = clock(self.target.device)
        emitted, finish = commit(candidates, n_new, cfg, self.target.eos_ids, text_of)
        n_used = min(len(path), len(emitted))
        nodes = [n if n.verdict is not Verdict.ACCEPTED or n.depth < n_used else
                 DraftToken(n.token_id, n.text, Verdict.DISCARDED, n.q_draft, None, None, n.parent, n.depth, n.head, n.rank)
                 for n in nodes]
        tokens.extend(t.token_id for t in emitted)
        run.feature = feature
        event = StepEvent(run.step, tuple(nodes), tuple(emitted), t1 - t0, t2 - t1, 1 if tree else 0, 1,
                          tree.size if tree else 0, finish)
        run.finish_reason = finish
        run.step += 1
        return event

    def _nodes(self, tree: Tree, node_tokens, q_nodes, p_rows, path: list[int], rejected: bool) -> list[DraftToken]:
        """Every tree node with its verdict: accepted on the path; rejected when the target judged it (a
        child of the path's end) and chose otherwise; discarded elsewhere."""
        on_path = set(path)
        judged_parent = path[-1] if path else -1
        out = []
        for i, token in enumerate(node_tokens):
            parent = tree.parents[i]
            if i in on_path:
                verdict = Verdict.ACCEPTED
            elif parent == judged_parent and rejected:
                verdict = Verdict.REJECTED
            else:
                verdict = Verdict.DISCARDED
            judged = verdict is not Verdict.DISCARDED
            out.append(DraftToken(token, self.target.text_of(token), verdict, q_nodes[i],
                                  p_target=float(p_rows[parent + 1, token]) if judged else None,
                                  parent=parent, depth=tree.depths[i] - 1, head=tree.depths[i] - 1, rank=tree.ranks[i]))
        return out
