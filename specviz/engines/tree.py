"""Tree speculative decoding: a drafter proposes a tree of candidates, the target verifies every node in one
forward and keeps the longest accepted path. The tree drafters are Medusa (medusa.py: Cai et al. 2024) and EAGLE
(eagle.py: Li et al. 2024, 2025); verifying a token tree in one forward with a tree attention mask follows SpecInfer
(Miao et al. 2024, "SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative Inference and
Verification"), and sampling along it the multi-draft rule of Chen et al. 2023 / Leviathan et al. 2023 applied at
each node.

The tree hangs off the last committed token (the root); each node is a drafted token whose parent is the token it
follows. Each step (`TreeEngine.cycle`):
1. draft: the proposer drafts a tree (its stored shape, or one grown from its confidence: EAGLE-2), and prompt
   lookup's and the datastore's continuations are grafted on as further branches (`graft`, DecodeConfig.lookup and
   .retrieve);
2. score: one target forward over the context and every node (a 4D mask: each node sees the context and its
   ancestors; explicit positions: its depth) gives p after the root and after each node, on the stock transformers
   model;
3. judge: greedy walks the tree from the root along the target's argmax (core.trees.greedy_walk), so the output is
   AR's token for token; sampling judges a node's children one after another against the target's residual
   (core.sampling.verify_tree: a chosen candidate, top-ranked or grafted, as a point mass, a drawn one against the
   distribution it was drawn from; the proof is in docs/exactness.md);
4. commit the accepted path and the target's own next token, keep only that path's keys and values, and hand the
   drafter the target's features of the positions kept (features.FeatureReader).

Terms (events.Verdict), per node: accepted (on the accepted path), rejected (judged and refused: greedy, a child of
the path's end; sampling, every candidate refused), discarded (never judged); the target's own token after the path
is resampled after a rejection, else a bonus token (a leaf reached). γ caps the tree's depth; τ counts tokens
committed per target forward, the resampled or bonus token included.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, Protocol

import torch

from specviz.config import DEFAULT_TARGET, DecodeConfig
from specviz.core import answers
from specviz.core.cache import CachedLM, clock
from specviz.core.lookup import match
from specviz.core.retrieval import Datastore, datastore_for, datastores
from specviz.core.sampling import TreeResult, WarpedRows, argmax_rows, pick, top_two, verify_tree, warp
from specviz.core.trees import Tree, greedy_walk
from specviz.drafters.trained import Drafter
from specviz.engines.base import commit
from specviz.engines.features import FeatureReader
from specviz.errors import ConfigError
from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD, DraftToken, StepEvent, Verdict
from specviz.models.loader import LoadedModel


@dataclass(frozen=True)
class TreeProposal:
    tree: Tree
    node_tokens: list[int]        # (n,) target token ids
    q_nodes: list[float]          # (n,) each node's probability under the distribution it came from
    # sampling, per node: the (V,) distribution it was drawn from, None for a chosen one (top-ranked, grafted: a
    # point mass to verify_tree); None: every node chosen
    q_drawn: tuple[torch.Tensor | None, ...] | None
    forwards: int
    # (node, source head) of the nodes a graft added: LOOKUP_HEAD, RETRIEVAL_HEAD
    grafted: tuple[tuple[int, int], ...] = ()


def graft(prop: TreeProposal, chain: list[int], source: int) -> TreeProposal:
    """The proposal with `chain` (prompt lookup's or the datastore's continuation of the context) as one
    more branch from the root: the chain follows the nodes that already carry its tokens and grows new ones
    where they stop (q = 1: neither source is a distribution, and sampling verifies them as point masses), marked
    with `source` (an events head). Greedy verification walks the tree along the target's argmax, and sampling
    judges every candidate against the target's residual, so a grafted branch can only add accepted tokens, never
    change the output's distribution."""
    nodes = {p: (t, q) for p, t, q in zip(prop.tree.paths, prop.node_tokens, prop.q_nodes)}  # path -> (token, q)
    drawn = dict(zip(prop.tree.paths, prop.q_drawn or ()))  # path -> the distribution a drawn node came from
    sources = {prop.tree.paths[i]: head for i, head in prop.grafted}
    path: tuple[int, ...] = ()
    for token in chain:
        kids = {nodes[p][0]: p for p in nodes if len(p) == len(path) + 1 and p[:-1] == path}
        if token in kids:
            path = kids[token]
            continue
        path += (1 + max((p[-1] for p in kids.values()), default=-1),)  # a new rank after its siblings'
        nodes[path] = (token, 1.0)
        sources[path] = source
    if len(nodes) == prop.tree.size:
        return prop
    tree = Tree.from_choices(nodes)
    q_drawn = tuple(drawn.get(p) for p in tree.paths) if prop.q_drawn is not None else None
    return TreeProposal(tree, [nodes[p][0] for p in tree.paths], [nodes[p][1] for p in tree.paths], q_drawn,
                        prop.forwards, tuple((i, sources[p]) for i, p in enumerate(tree.paths) if p in sources))


class TreeProposer(Protocol):
    """A tree drafter (medusa.MedusaProposer, eagle.EagleProposer): a fresh per-run state that reads the target's
    features, then each step a tree hanging off the last committed token."""
    d: Drafter  # the trained drafter it proposes with (its datastore serves cfg.retrieve when it has one)

    def start(self, vocab_size: int, eos_ids: frozenset[int]) -> FeatureReader: ...

    def propose(self, state: FeatureReader, tokens: list[int], tree: Tree, cfg: DecodeConfig, room: int,
                generator: torch.Generator) -> TreeProposal | None:
        """A tree at most `room` levels deep (`tree`: the stored shape, for a static tree); None before the target's
        first forward (no features yet)."""
        ...


def tree_verdicts(prop: TreeProposal, p_rows: "torch.Tensor | WarpedRows", path: list[int], rejected: bool,
                  result: TreeResult | None, text_of: Callable[[int], str]) -> list[DraftToken]:
    """Every tree node with its verdict: accepted on the path; rejected when the target judged it and chose
    otherwise (greedy: a child of the path's end; sampling: every candidate refused, the path's end's and the
    siblings refused before an accepted one, each with its min(1, r/q)); discarded elsewhere. A refused node carries
    the target's top-2 probabilities at its parent (rows the walk read)."""
    tree, on_path, sources = prop.tree, set(path), dict(prop.grafted)
    tops: dict[int, tuple[float, float]] = {}  # parent row -> its top-2, read once per row
    judged_parent = path[-1] if path else -1
    trials = {t.node: t for t in result.trials} if result is not None else {}
    out = []
    for i, token in enumerate(prop.node_tokens):
        parent = tree.parents[i]
        if i in on_path:
            verdict = Verdict.ACCEPTED
        elif (i in trials) if result is not None else (parent == judged_parent and rejected):
            verdict = Verdict.REJECTED
        else:
            verdict = Verdict.DISCARDED
        judged = verdict is not Verdict.DISCARDED
        if verdict is Verdict.REJECTED and parent + 1 not in tops:
            tops[parent + 1] = top_two(p_rows[parent + 1])
        top = tops[parent + 1] if verdict is Verdict.REJECTED else (None, None)
        out.append(DraftToken(token, text_of(token), verdict, prop.q_nodes[i],
                              p_target=float(p_rows[parent + 1, token]) if judged else None,
                              accept_prob=trials[i].accept_prob if judged and i in trials else None,
                              parent=parent, depth=tree.depths[i] - 1,
                              head=sources.get(i, tree.depths[i] - 1), rank=tree.ranks[i],
                              p_top1=top[0], p_top2=top[1]))
    return out


@dataclass
class TreeRun:
    cfg: DecodeConfig
    target: CachedLM
    drafts: FeatureReader
    generator: torch.Generator
    prompt_len: int
    tokens: list[int]
    datastore: Datastore | None = None  # cfg.retrieve: the drafter's own (Drafter.datastore), else the target's
    step: int = 0
    finish_reason: str | None = None


@dataclass(frozen=True)
class TreeCycle:
    """One tree step: its event, and what lies behind it (for the step-through view)."""
    event: StepEvent
    proposal: TreeProposal | None  # None: the prefill, or no room to draft
    p_rows: torch.Tensor | WarpedRows  # (1 + n, V) warped target rows (sampling: each when read): row 0 after the root
    result: TreeResult | None      # sampling: every candidate judged, with the residual after each refusal


class RowArgmax:
    """argmax_rows of warped rows, each row's when first asked for (greedy_walk's `choice`)."""

    def __init__(self, rows: WarpedRows):
        self.rows = rows

    def __getitem__(self, i: int) -> int:
        return argmax_rows(self.rows[i][None])[0]


@dataclass(frozen=True)
class Verified:
    """What one target forward decided (TreeEngine.verify, or .prefill with nothing drafted)."""
    path: list[int]                # the accepted nodes, root to leaf
    candidates: list[tuple[int, Verdict, float | None]]  # what to commit, in order, with p_target
    nodes: list[DraftToken]        # every node with its verdict
    kept: torch.Tensor             # the target's features of the positions its cache keeps
    p_rows: torch.Tensor | WarpedRows  # (1 + n, V)
    result: TreeResult | None


def committed_answers() -> Iterable[list[int]]:
    """The embedded target's own answers: its committed self-distillation ids (what `make drafters` trains on)."""
    return (row["answer_ids"] for row in answers.committed_examples())


ANSWERS = {DEFAULT_TARGET: committed_answers}  # target -> its answers, handed to retrieval.datastore_for


class TreeEngine:
    def __init__(self, method: str, target: LoadedModel, proposer: TreeProposer, choices):
        self.method, self.target, self.proposer = method, target, proposer
        self.tree = Tree.from_choices(choices)

    def steps(self, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[StepEvent]:
        run = self.start(prompt_ids, cfg)
        while run.finish_reason is None:
            yield self.cycle(run).event

    def start(self, prompt_ids: list[int], cfg: DecodeConfig) -> TreeRun:
        store = (self.proposer.d.datastore or datastore_for(self.target.name, ANSWERS.get(self.target.name))
                 if cfg.retrieve else None)
        if cfg.retrieve and store is None:
            have = " and ".join(sorted(datastores() | set(ANSWERS)))
            raise ConfigError(f"retrieve={cfg.retrieve} needs a datastore of the target's own answers: there is one "
                              f"for {have} and for drafters trained on your own data "
                              f"(python -m specviz train --data), not for {self.target.name}")
        return TreeRun(cfg=cfg, target=CachedLM.of(self.target),
                       drafts=self.proposer.start(self.target.vocab_size, self.target.eos_ids),
                       generator=torch.Generator().manual_seed(cfg.seed), prompt_len=len(prompt_ids),
                       tokens=list(prompt_ids), datastore=store)

    def cycle(self, run: TreeRun) -> TreeCycle:
        """Draft a tree, score every node in one target forward, judge, commit the accepted path: the module's steps
        1-4; advances `run` by one step."""
        cfg, device = run.cfg, self.target.device
        n_new = len(run.tokens) - run.prompt_len
        cap = cfg.max_new_tokens - n_new - 1  # never draft past the length cap
        room = min(cfg.initial_gamma(), cap)  # γ caps the drafter's depth
        t0 = clock(device)
        prop = self.draft(run, room, cap)  # 1.
        t1 = clock(device)
        verified = self.prefill(run) if prop is None else self.verify(run, prop)  # 2. and 3.
        run.drafts.observe(verified.kept)  # 4. the drafter's features: those of the positions the target keeps
        run.drafts.rollback(run.target.seen)
        t2 = clock(device)
        emitted, finish = commit(verified.candidates, n_new, cfg, self.target.eos_ids, self.target.text_of)
        n_used = min(len(verified.path), len(emitted))  # accepted drafts after an EOS are never used
        nodes = [n if n.verdict is not Verdict.ACCEPTED or n.depth < n_used else
                 replace(n, verdict=Verdict.DISCARDED, p_target=None, accept_prob=None) for n in verified.nodes]
        run.tokens.extend(t.token_id for t in emitted)
        event = StepEvent(step=run.step, drafts=tuple(nodes), emitted=tuple(emitted), draft_s=t1 - t0,
                          verify_s=t2 - t1, draft_forwards=prop.forwards if prop else 0, target_forwards=1,
                          gamma=max(prop.tree.depths, default=0) if prop else 0,
                          tree_size=prop.tree.size if prop else 0, finish_reason=finish)
        run.finish_reason = finish
        run.step += 1
        return TreeCycle(event, prop, verified.p_rows, verified.result)

    def draft(self, run: TreeRun, room: int, cap: int) -> TreeProposal | None:
        """The proposer's tree with the grafted branches; None with no room, or before the target's first forward."""
        if room <= 0:
            return None
        prop = self.proposer.propose(run.drafts, run.tokens, self.tree, run.cfg, room, run.generator)
        return self.graft_branches(prop, run, cap) if prop is not None else None

    def graft_branches(self, prop: TreeProposal, run: TreeRun, cap: int) -> TreeProposal:
        """The proposal with prompt lookup's and the datastore's branches (cfg.lookup, cfg.retrieve). The
        datastore's steps aside when prompt lookup matched its longest n-gram: behind such a match its nodes were
        rarely accepted where the lookup's were not (experiments/results/datastore_rows.txt), and without those rows
        it ran as fast with the same τ."""
        cfg, tokens = run.cfg, run.tokens
        chain, order = (match(tokens, min(cfg.lookup, cap), cfg.pld_ngram_max, cfg.pld_ngram_min, self.target.eos_ids)
                        if cfg.lookup else ([], 0))
        prop = graft(prop, chain, LOOKUP_HEAD)
        if cfg.retrieve and order < cfg.pld_ngram_max:
            for chain in run.datastore.drafts(tokens, cfg.retrieve, cap):
                prop = graft(prop, chain, RETRIEVAL_HEAD)
        return prop

    def prefill(self, run: TreeRun) -> Verified:
        """Nothing drafted (the target's prefill, or no room left): one target forward and its own next token."""
        logits, hidden = run.target.logits(run.tokens, keep=1, features=run.drafts.features)
        p = warp(logits[0, :self.target.vocab_size], run.cfg)  # (V,)
        nxt = pick(p, run.cfg.greedy, run.generator)
        return Verified([], [(nxt, Verdict.PLAIN, float(p[nxt]))], [], hidden, p[None], None)

    def verify(self, run: TreeRun, prop: TreeProposal) -> Verified:
        """Score every node in one target forward, then walk (greedy) or judge (sampling) the tree from the root; the
        target's cache keeps the accepted path."""
        tree, node_tokens, n_ctx = prop.tree, prop.node_tokens, len(run.tokens)
        n_fed = n_ctx - run.target.seen
        # logits (1 + n, V)
        logits, hidden = run.target.tree_logits(run.tokens, tree, node_tokens, features=run.drafts.features)
        logits = logits[:, :self.target.vocab_size]  # row 0: after the root; row i + 1: after node i
        if run.cfg.greedy:  # the rows the walk reaches, each warped when read: a wide tree's other rows never are
            p_rows = WarpedRows(logits, run.cfg)  # (experiments/probes/many_rows.py: the glue at 32 and 64 rows)
            path, nxt = greedy_walk(tree, node_tokens, RowArgmax(p_rows))
            rejected, result = bool(tree.children(path[-1] if path else -1)), None
        else:  # the rows of the nodes the walk reaches, each warped when read
            p_rows = WarpedRows(logits, run.cfg)
            result = verify_tree(tree.parents, node_tokens, prop.q_drawn, p_rows, run.generator)
            path, nxt, rejected = result.path, result.next_token, result.rejected
        last_row = path[-1] + 1 if path else 0
        candidates = [(node_tokens[i], Verdict.ACCEPTED, float(p_rows[tree.parents[i] + 1, node_tokens[i]]))
                      for i in path]
        candidates.append((nxt, Verdict.RESAMPLED if rejected else Verdict.BONUS, float(p_rows[last_row, nxt])))
        nodes = tree_verdicts(prop, p_rows, path, rejected, result, self.target.text_of)
        kept = torch.cat([hidden[:n_fed], hidden[n_fed:][path]])  # the features of what the cache keeps
        run.target.keep_path(n_ctx, path)
        return Verified(path, candidates, nodes, kept, p_rows, result)
