"""Tree speculative decoding: a drafter proposes a candidate tree, the target verifies every node in one
forward (4D mask, explicit positions, the stock transformers model) and keeps only the accepted path's KV.

The tree hangs off the last committed token (the root). Two proposers read the target's features:
- Medusa: K heads on the last feature; head k proposes the nodes at depth k (its top-ranked tokens).
- EAGLE: the one-layer drafter expands the tree level by level, each node attending to the true context
  and its own ancestors, and proposes each node's children from its predicted feature.
Greedy decoding walks the tree along the target's argmax, so the output equals plain greedy decoding.
Sampling verifies the same tree exactly (core/sampling.verify_tree): at each node its children are judged one
after another against the target's residual, a chosen candidate (top-ranked, grafted) as a point mass, a drawn one
against the distribution it was drawn from; the proof is in docs/exactness.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from specviz.config import ConfigError, DecodeConfig
from specviz.core.cache import CachedLM, clock
from specviz.core.lookup import match
from specviz.core.retrieval import Datastore, datastore_for, datastores
from specviz.core.sampling import TreeResult, pick, verify_tree, warp
from specviz.core.trees import Tree, greedy_walk
from specviz.drafters.trained import Drafter, choose_tree, path_value
from specviz.engines.base import commit
from specviz.engines.eagle import EagleSession, FeatureHistory
from specviz.engines.speculative import Proposal, SpeculativeEngine, stop_drafting
from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD, DraftToken, StepEvent, Verdict
from specviz.models.loader import LoadedModel

# Defaults for 2 CPU cores, where verifying 16 tokens costs about two AR steps: the top-1 chain plus the
# runners-up that pay most often. Trained drafters store their own tree, chosen from measured accuracies.
MEDUSA_CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
                  (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0)]
EAGLE_CHOICES = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0), (0, 0, 0, 0, 0)]


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


class ProposerState(Protocol):
    features: bool | tuple  # what it reads from each target forward (CachedLM.logits' `features`)

    def observe(self, hidden: torch.Tensor) -> None:
        """The target's features of the positions its cache now holds beyond the previous ones."""

    def rollback(self, n_valid: int) -> None:
        """Forget everything about positions from n_valid on."""


class MedusaState:
    features = True  # the final-norm hidden state

    def __init__(self):
        self.feature: torch.Tensor | None = None

    def observe(self, hidden: torch.Tensor) -> None:
        self.feature = hidden[-1]

    def rollback(self, n_valid: int) -> None:
        pass  # only the last feature is kept


class MedusaProposer:
    def __init__(self, drafter: Drafter):
        self.d = drafter

    def start(self, vocab_size: int, eos_ids: frozenset[int]) -> MedusaState:
        return MedusaState()

    @torch.inference_mode()
    def propose(self, state: MedusaState, tokens: list[int], tree: Tree, cfg: DecodeConfig, room: int,
                generator: torch.Generator) -> TreeProposal | None:
        if state.feature is None:
            return None
        feats = self.d.module(self.d.inputs(state.feature[None]))[:, 0]  # (K, d)
        # (K, N)
        q_heads = torch.stack([warp(self.d.logits(f, head=k).float().cpu(), cfg) for k, f in enumerate(feats)])
        # the top-ranked tree, greedy or sampling (chosen nodes: point masses to verify_tree)
        if cfg.tree == "dynamic":  # the heads are independent: the paths of highest product of their probabilities
            depth = min(cfg.tree_depth, room, len(q_heads))
            ranked = torch.argsort(q_heads[:depth], dim=-1, descending=True)[:, :cfg.tree_topk]  # (depth, k)
            top = torch.gather(q_heads[:depth], 1, ranked)  # (depth, k) their probabilities
            tree = Tree.from_choices([p for p in choose_tree(top, cfg.tree_nodes) if path_value(top, p) > 0])
        else:
            tree = Tree.from_choices([p for p in tree.paths if len(p) <= room])
            ranked = torch.argsort(q_heads, dim=-1, descending=True)[:, :1 + max(tree.ranks)]  # (K, r)
        small = [int(ranked[tree.depths[i] - 1, tree.ranks[i]]) for i in range(tree.size)]
        q_nodes = [float(q_heads[tree.depths[i] - 1, s]) for i, s in enumerate(small)]
        ids = [int(t) for t in self.d.to_target_ids(torch.tensor(small)).tolist()]
        return TreeProposal(tree, ids, q_nodes, None, 1)


class MedusaChainDrafter:
    """Medusa as a chain drafter (the step-through view, the drafter check): draft k is head k's draw from
    the feature of the last committed token's position, verified as a chain like any drafter."""

    def __init__(self, drafter: Drafter, name: str):
        self.drafter, self.name = drafter, name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "MedusaChainSession":
        return MedusaChainSession(self.drafter, vocab_size, eos_ids)


class MedusaChainSession(FeatureHistory):
    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: DecodeConfig, generator: torch.Generator) -> Proposal:
        if len(self.feats) < len(tokens) - 1 or not len(self.feats) or gamma <= 0:
            return self.nothing()
        feats = self.d.module(self.d.inputs(self.feats[len(tokens) - 2][None]))[:, 0]  # (K, d)
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        for k in range(min(gamma, len(feats))):
            token, q, confidence = self.d.draw(self.d.logits(feats[k], head=k), cfg, generator)
            drafted.append(token)
            qs.append(q)
            if stop_drafting(token, confidence, self.eos_ids, cfg):
                break
        return Proposal(drafted, torch.stack(qs), 1)


class EagleProposer:
    def __init__(self, drafter: Drafter):
        self.d = drafter

    def start(self, vocab_size: int, eos_ids: frozenset[int]) -> EagleSession:
        return EagleSession(self.d, vocab_size, eos_ids)

    @torch.inference_mode()
    def propose(self, state: EagleSession, tokens: list[int], tree: Tree, cfg: DecodeConfig, room: int,
                generator: torch.Generator) -> TreeProposal | None:
        feat = state.context_feature(tokens)  # greedy or sampling: the top-ranked tree (point masses when sampling)
        if feat is None:
            return None
        if cfg.tree == "dynamic":  # EAGLE-2: a tree grown from the drafter's confidence
            grown = state.grow_tree(feat, cfg, min(cfg.tree_depth, room))
            return TreeProposal(grown.tree, grown.node_tokens, grown.q_nodes, None, grown.forwards)
        tree = Tree.from_choices([p for p in tree.paths if len(p) <= room])
        node_feat: dict[int, torch.Tensor] = {-1: feat}  # the predicted feature each node's children come from
        small: list[int] = [0] * tree.size
        q_nodes: list[float] = [0.0] * tree.size
        fed: list[int] = []  # tree nodes whose pairs are in `kv`, in order
        kv, forwards = state.kv, 0
        ancestry = tree.ancestry()
        for depth in range(1, max(tree.depths) + 1):
            level = [i for i in range(tree.size) if tree.depths[i] == depth]
            for parent in sorted({tree.parents[i] for i in level}):
                probs = warp(self.d.logits(node_feat[parent]).float().cpu(), cfg)  # (N,)
                kids = [i for i in level if tree.parents[i] == parent]
                top = torch.topk(probs, 1 + max(tree.ranks[i] for i in kids))
                for i in kids:
                    small[i], q_nodes[i] = int(top.indices[tree.ranks[i]]), float(top.values[tree.ranks[i]])
            grow = [i for i in level if tree.children(i)]  # nodes whose children are proposed next
            if not grow:
                break
            ids = self.d.to_target_ids(torch.tensor([small[i] for i in grow]))
            inputs = torch.stack([node_feat[tree.parents[i]] for i in grow])
            visible = ancestry[grow][:, fed + grow]  # each node sees the true context, its ancestors and itself
            out, kv = state.feed_nodes(kv, inputs, ids, visible, depth)
            forwards += 1
            for row, i in enumerate(grow):
                node_feat[i] = out[row]
            fed += grow
        node_tokens = [int(t) for t in self.d.to_target_ids(torch.tensor(small)).tolist()]
        return TreeProposal(tree, node_tokens, q_nodes, None, forwards + 1)


@dataclass
class TreeRun:
    cfg: DecodeConfig
    target: CachedLM
    drafts: ProposerState
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
    p_rows: torch.Tensor           # (1 + n, V) warped target distributions: row 0 after the root, i + 1 after node i
    result: TreeResult | None      # sampling: every candidate judged, with the residual after each refusal


class TreeEngine:
    def __init__(self, method: str, target: LoadedModel, proposer, choices):
        self.method, self.target, self.proposer = method, target, proposer
        self.tree = Tree.from_choices(choices)

    def steps(self, prompt_ids: list[int], cfg: DecodeConfig) -> Iterator[StepEvent]:
        run = self.start(prompt_ids, cfg)
        while run.finish_reason is None:
            yield self.cycle(run).event

    def start(self, prompt_ids: list[int], cfg: DecodeConfig) -> TreeRun:
        store = (self.proposer.d.datastore or datastore_for(self.target.name)) if cfg.retrieve else None
        if cfg.retrieve and store is None:
            raise ConfigError(f"retrieve={cfg.retrieve} needs a datastore of the target's own answers: there is one "
                              f"for {' and '.join(sorted(datastores()))} and for drafters trained on your own data "
                              f"(python -m specviz train --data), not for {self.target.name}")
        return TreeRun(cfg, CachedLM.of(self.target),
                       self.proposer.start(self.target.vocab_size, self.target.eos_ids),
                       torch.Generator().manual_seed(cfg.seed), len(prompt_ids), list(prompt_ids), store)

    def cycle(self, run: TreeRun) -> TreeCycle:
        """Propose a tree, verify it in one target forward, commit the accepted path; one step of `run`."""
        cfg, tokens, vocab, text_of = run.cfg, run.tokens, self.target.vocab_size, self.target.text_of
        n_new = len(tokens) - run.prompt_len
        cap = cfg.max_new_tokens - n_new - 1  # never draft past the length cap
        room = min(cfg.initial_gamma(), cap)  # γ caps the drafter's depth
        t0 = clock(self.target.device)
        prop = self.proposer.propose(run.drafts, tokens, self.tree, cfg, room, run.generator) if room > 0 else None
        if prop is not None:
            prop = self._grafted(prop, run, cap)
        t1 = clock(self.target.device)
        n_ctx = len(tokens)
        n_fed = n_ctx - run.target.seen
        if prop is None:  # the first step (the target's prefill), or no room left
            logits, hidden = run.target.logits(tokens, keep=1, features=run.drafts.features)
            p = warp(logits[0, :vocab], cfg)
            nxt = pick(p, cfg.greedy, run.generator)
            path, candidates, nodes = [], [(nxt, Verdict.PLAIN, float(p[nxt]))], []
            kept, p_rows, result = hidden, p[None], None
        else:
            tree, node_tokens = prop.tree, prop.node_tokens
            # logits (1 + n, V)
            logits, hidden = run.target.tree_logits(tokens, tree, node_tokens, features=run.drafts.features)
            p_rows = warp(logits[:, :vocab], cfg)  # row 0: after the root; row i + 1: after node i
            if cfg.greedy:
                path, nxt = greedy_walk(tree, node_tokens, p_rows.argmax(-1).tolist())
                rejected, result = bool(tree.children(path[-1] if path else -1)), None
            else:
                result = verify_tree(tree.parents, node_tokens, prop.q_drawn, p_rows, run.generator)
                path, nxt, rejected = result.path, result.next_token, result.rejected
            last_row = path[-1] + 1 if path else 0
            candidates = [(node_tokens[i], Verdict.ACCEPTED, float(p_rows[tree.parents[i] + 1, node_tokens[i]]))
                          for i in path]
            candidates.append((nxt, Verdict.RESAMPLED if rejected else Verdict.BONUS, float(p_rows[last_row, nxt])))
            nodes = self._nodes(prop, p_rows, path, rejected, result)
            kept = torch.cat([hidden[:n_fed], hidden[n_fed:][path]])  # the features of what the cache keeps
            run.target.keep_path(n_ctx, path)
        run.drafts.observe(kept)
        run.drafts.rollback(run.target.seen)
        t2 = clock(self.target.device)
        emitted, finish = commit(candidates, n_new, cfg, self.target.eos_ids, text_of)
        n_used = min(len(path), len(emitted))  # accepted drafts after an EOS are never used
        nodes = [n if n.verdict is not Verdict.ACCEPTED or n.depth < n_used else
                 DraftToken(n.token_id, n.text, Verdict.DISCARDED, n.q_draft, None, None, n.parent, n.depth, n.head,
                            n.rank)
                 for n in nodes]
        tokens.extend(t.token_id for t in emitted)
        size = prop.tree.size if prop else 0
        event = StepEvent(run.step, tuple(nodes), tuple(emitted), t1 - t0, t2 - t1, prop.forwards if prop else 0, 1,
                          size, finish)
        run.finish_reason = finish
        run.step += 1
        return TreeCycle(event, prop, p_rows, result)

    def _grafted(self, prop: TreeProposal, run: TreeRun, cap: int) -> TreeProposal:
        """The proposal with prompt lookup's and the datastore's branches (cfg.lookup, cfg.retrieve). The
        datastore's steps aside when prompt lookup matched its longest n-gram: behind such a match its nodes were
        rarely accepted where the lookup's were not (4.2% of them on held-out answers, against 9.6-24% behind
        shorter matches: experiments/results/datastore_rows.txt), and without those rows it ran as fast with the same τ
        (README, Performance)."""
        cfg, tokens = run.cfg, run.tokens
        chain, order = (match(tokens, min(cfg.lookup, cap), cfg.pld_ngram_max, cfg.pld_ngram_min, self.target.eos_ids)
                        if cfg.lookup else ([], 0))
        prop = graft(prop, chain, LOOKUP_HEAD)
        if cfg.retrieve and order < cfg.pld_ngram_max:
            for chain in run.datastore.drafts(tokens, cfg.retrieve, cap):
                prop = graft(prop, chain, RETRIEVAL_HEAD)
        return prop

    def _nodes(self, prop: TreeProposal, p_rows: torch.Tensor, path: list[int], rejected: bool,
               result: TreeResult | None) -> list[DraftToken]:
        """Every tree node with its verdict: accepted on the path; rejected when the target judged it and chose
        otherwise (greedy: a child of the path's end; sampling: every candidate refused, the path's end's and the
        siblings refused before an accepted one, each with its min(1, r/q)); discarded elsewhere."""
        tree, on_path, sources = prop.tree, set(path), dict(prop.grafted)
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
            out.append(DraftToken(token, self.target.text_of(token), verdict, prop.q_nodes[i],
                                  p_target=float(p_rows[parent + 1, token]) if judged else None,
                                  accept_prob=trials[i].accept_prob if judged and i in trials else None,
                                  parent=parent, depth=tree.depths[i] - 1,
                                  head=sources.get(i, tree.depths[i] - 1), rank=tree.ranks[i]))
        return out


def medusa_engine(target: LoadedModel, drafter: Drafter, choices=None) -> TreeEngine:
    choices = [p for p in (choices or drafter.cfg.tree or MEDUSA_CHOICES) if len(p) <= drafter.cfg.medusa_heads]
    return TreeEngine("medusa", target, MedusaProposer(drafter), choices)


def eagle_tree_engine(target: LoadedModel, drafter: Drafter, choices=None) -> TreeEngine:
    return TreeEngine("eagle", target, EagleProposer(drafter), choices or drafter.cfg.tree or EAGLE_CHOICES)


def build_medusa(target: LoadedModel, drafter: Drafter, chain: bool = False, name: str = ""):
    """Medusa's engine (methods.MethodSpec.engine): its tree, or with chain=True (the step-through) one draw per head
    verified as a chain."""
    if chain:
        return SpeculativeEngine("medusa", target, MedusaChainDrafter(drafter, name))
    return medusa_engine(target, drafter)
