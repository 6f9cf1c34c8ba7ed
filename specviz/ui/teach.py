"""Teaching mode: speculative decoding one draft/verify cycle at a time, with the distributions behind it.

The engine's own cycle (SpeculativeEngine.cycle) does the work, so the tokens here are the engine's tokens
for the same seed and settings, draw for draw. This module only keeps a session's state between clicks
and turns each cycle's tensors into plain values for the figures: q_draft and p_target over the top tokens
at every drafted position, min(1, p/q), the uniform draw u and the verdict; after a refusal the residual
norm(max(0, p − q)) the target's own token was drawn from; for greedy, the target's argmax.

Tree methods (EAGLE, Medusa) step through the race's own tree engine: each candidate the target judged is a
position, in the order it was judged; when sampling, a refused sibling's bars show the residual r it was judged
against (p for a node's first child) and the residual after its refusal, which the next sibling is judged against.

    session = start(prompt, cfg)          # models shared read-only; caches and generator per session
    view = advance(session)               # one cycle -> CycleView (plain values)

A session pickles as its recipe (a Replay: prompt, settings, steps taken), never its models or caches: on
ZeroGPU the handlers' arguments and results cross processes pickled. resume() replays a recipe from its seed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from specviz import methods, metrics
from specviz.config import DEFAULT_DRAFT, DEFAULT_TARGET, DecodeConfig
from specviz.engines.speculative import Cycle, RunState, SpeculativeEngine
from specviz.engines.tree import TreeCycle, TreeEngine, TreeRun
from specviz.events import LOOKUP_HEAD, RETRIEVAL_HEAD, StepEvent

TOP = 6  # tokens per bar chart


@dataclass(frozen=True)
class Bar:
    token_id: int
    text: str
    q_draft: float
    p_target: float
    residual: Optional[float] = None  # norm(max(0, p − q)) at a refused position


@dataclass(frozen=True)
class PositionView:
    """One position of a cycle: a drafted token and how the target judged it, or the target's own token."""
    position: int                 # 0-based within the cycle
    kind: str                     # "draft" | "resampled" | "bonus" | "plain"
    token_id: int
    text: str
    verdict: str                  # accepted | rejected | discarded | resampled | bonus | plain
    q_draft: Optional[float]      # the drafted token's q (None for the target's own token)
    p_target: Optional[float]
    accept_prob: Optional[float]  # min(1, p/q), sampling only
    u: Optional[float]            # the uniform draw compared with accept_prob, sampling only
    target_argmax: Optional[str]  # greedy: the target's choice at this position
    bars: list[Bar]               # the top tokens by p (and q, and the residual where there is one); a tree
                                  # candidate: p_target holds r, the residual it was judged against
    # tree steps only: the node, its parent (-1: the root), which of the node's children it was (0: the first
    # judged) and where it came from ("top-ranked", "drawn", "prompt lookup", "datastore")
    node: Optional[int] = None
    parent: Optional[int] = None
    sibling: int = 0
    source: Optional[str] = None
    r: Optional[float] = None     # sampling: r(x), the residual's probability of it at its turn (p for the first)


@dataclass(frozen=True)
class CycleView:
    step: int
    greedy: bool
    gamma: int
    positions: list[PositionView]
    emitted: list[str]
    n_accepted: int
    rejected: bool
    finish_reason: Optional[str]
    tree: bool = False            # a tree step: positions are the judged candidates, in the order judged

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TeachSession:
    """Per-session state (kept in gr.State): the engine run and what was shown so far."""
    engine: SpeculativeEngine | TreeEngine
    run: RunState | TreeRun
    prompt: str
    draft: str
    target: str
    events: list[StepEvent] = field(default_factory=list)
    views: list[CycleView] = field(default_factory=list)
    given_draft: str = ""          # the draft or drafter spec start() was given (what a replay needs)

    def __reduce__(self):
        return Replay, (self.prompt, self.cfg, self.target, self.given_draft, len(self.events), self.measured())

    @property
    def cfg(self) -> DecodeConfig:
        return self.run.cfg

    @property
    def finished(self) -> bool:
        return self.run.finish_reason is not None

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for e in self.events for t in e.emitted]

    def measured(self) -> dict:
        """α, τ and an estimate of c from the steps so far (None before any drafted token was judged).
        c here is one draft forward's time over one verify forward's: the teaching tab runs no AR lane."""
        s = metrics.summarize(self.engine.method, self.events)
        c = None
        if s.steps and s.verify_s:
            per_verify = s.verify_s / s.steps
            if s.draft_forwards:
                c = (s.draft_s / s.draft_forwards) / per_verify
            elif s.drafted:
                c = (s.draft_s / max(1, sum(e.gamma for e in self.events))) / per_verify
        gammas = [e.gamma for e in self.events if e.gamma]
        return {"alpha": s.alpha, "tau": s.tau if s.steps else None, "c": c, "steps": s.steps,
                "drafted": s.drafted, "accepted": s.accepted, "tokens": s.new_tokens,
                "gamma": sum(gammas) / len(gammas) if gammas else None}


def start(prompt: str, cfg: DecodeConfig, target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT) -> TeachSession:
    """Validate and load as the race does (session.prepare: policy, caps, the shared models), then open a run."""
    from specviz.engines.session import prepare

    # one cycle per click: a chain drafter's chain, a tree drafter's tree (the race's own engine)
    prepared = prepare(prompt, cfg, target, draft, chain=not methods.spec(cfg.method).tree)
    engine = prepared.engine
    return TeachSession(engine, engine.start(prepared.prompt_ids, prepared.cfg), prompt,
                        draft if methods.spec(cfg.method).uses_draft_model else "", target, given_draft=draft)


@dataclass(frozen=True)
class Replay:
    """A pickled TeachSession: how to rebuild it (the seed makes the replay draw for draw the same run)."""
    prompt: str
    cfg: DecodeConfig
    target: str
    draft: str
    steps: int
    measured_so_far: dict

    def measured(self) -> dict:
        return self.measured_so_far


def resume(state: "TeachSession | Replay") -> TeachSession:
    """A live session: the session itself, or a Replay run again for its steps."""
    if isinstance(state, TeachSession):
        return state
    session = start(state.prompt, state.cfg, state.target, state.draft)
    for _ in range(state.steps):
        advance(session)
    return session


def advance(session: TeachSession) -> Optional[CycleView]:
    """Run one cycle; None when the run has already finished."""
    if session.finished:
        return None
    cycle = session.engine.cycle(session.run)
    view = (tree_cycle_view if isinstance(cycle, TreeCycle) else cycle_view)(cycle, session.engine.target.text_of,
                                                                              session.cfg.greedy)
    session.events.append(cycle.event)
    session.views.append(view)
    return view


def _bars(token_ids: list[int], q: torch.Tensor, p: torch.Tensor, r: Optional[torch.Tensor], text_of) -> list[Bar]:
    return [Bar(t, text_of(t), float(q[t]), float(p[t]), None if r is None else float(r[t])) for t in token_ids]


def _top(*dists: torch.Tensor, must: tuple[int, ...] = (), n: int = TOP) -> list[int]:
    """The n most likely tokens under the first distribution, topped up from the others, with `must` in."""
    out = list(dict.fromkeys(int(t) for t in must))
    for dist in dists:
        for t in torch.topk(dist, min(n, dist.shape[0])).indices.tolist():
            if len(out) >= n:
                break
            if t not in out and float(dist[t]) > 0:
                out.append(t)
    return out


def cycle_view(cycle: Cycle, text_of, greedy: bool) -> CycleView:
    """A cycle's tensors -> plain values: bars for each judged position and for the target's own token."""
    event, proposal, p_target, result = cycle.event, cycle.proposal, cycle.p_target, cycle.result
    q_draft = proposal.q_draft  # (k, V)
    k = len(proposal.token_ids)
    positions = []
    for i, node in enumerate(event.drafts):
        q_i, p_i = q_draft[i], p_target[i]
        judged = node.verdict.value in ("accepted", "rejected")
        top = _top(p_i, q_i, must=(node.token_id,))
        top.sort(key=lambda t: -float(p_i[t]))
        argmax = text_of(int(torch.argmax(p_i))) if greedy and judged else None
        positions.append(PositionView(
            i, "draft", node.token_id, node.text, node.verdict.value, node.q_draft, node.p_target, node.accept_prob,
            result.u[i] if judged and result.u is not None else None, argmax,
            _bars(top, q_i, p_i, None, text_of) if judged else []))
    n = result.n_accepted
    if len(event.emitted) > min(n, k):  # the target's own token was emitted (not cut by EOS or the length cap)
        own = event.emitted[-1]
        p_n = p_target[n]
        q_n = q_draft[n] if result.rejected else torch.zeros_like(p_n)
        r = result.next_probs if result.rejected and not greedy else None
        top = _top(*((r, p_n) if r is not None else (p_n,)), must=(own.token_id,))
        top.sort(key=lambda t: -float((r if r is not None else p_n)[t]))
        positions.append(PositionView(
            n, own.verdict.value, own.token_id, own.text, own.verdict.value, None, own.p_target, None, None,
            text_of(int(torch.argmax(p_n))) if greedy else None, _bars(top, q_n, p_n, r, text_of)))
    return CycleView(event.step, greedy, event.gamma, positions, [t.text for t in event.emitted],
                     event.n_accepted, result.rejected, event.finish_reason)


SOURCES = {LOOKUP_HEAD: "prompt lookup", RETRIEVAL_HEAD: "datastore"}


def tree_cycle_view(cycle: TreeCycle, text_of, greedy: bool) -> CycleView:
    """A tree step's tensors -> plain values: one position per candidate the target judged, in the order judged
    (greedy: the accepted path and the refused children of its end, each against the target's argmax; sampling:
    every trial of verify_tree, with the residual r before it and after its refusal), then the target's own token."""
    event, prop, p_rows, result = cycle.event, cycle.proposal, cycle.p_rows, cycle.result
    positions = []
    if prop is not None:
        tree, drafts = prop.tree, event.drafts
        drawn = prop.q_drawn or (None,) * tree.size

        def source(i: int) -> str:
            return SOURCES.get(drafts[i].head, "drawn" if drawn[i] is not None else "top-ranked")

        def q_of(i: int, t: int) -> float:  # the distribution the candidate came from: drawn q, or a point mass
            return float(drawn[i][t]) if drawn[i] is not None else float(t == prop.node_tokens[i])

        if greedy:
            judged = [i for i, d in enumerate(drafts) if d.verdict.value in ("accepted", "rejected")]
            trials = [(i, None) for i in judged]
        else:
            trials = [(t.node, t) for t in result.trials]
        seen: dict[int, int] = {}
        for i, trial in trials:
            parent, x, d = tree.parents[i], prop.node_tokens[i], drafts[i]
            p = p_rows[parent + 1]
            before = p if trial is None else trial.before
            after = None if trial is None else trial.after
            top = _top(*(t for t in (before, after, p) if t is not None), must=(x,))
            top.sort(key=lambda t: -float(before[t]))
            bars = [Bar(t, text_of(t), q_of(i, t), float(before[t]), None if after is None else float(after[t]))
                    for t in top]
            argmax = text_of(int(torch.argmax(p))) if greedy else None
            positions.append(PositionView(
                tree.depths[i] - 1, "draft", x, d.text, d.verdict.value, None if trial is None else trial.q,
                float(p[x]), None if trial is None else trial.accept_prob, None if trial is None else trial.u, argmax,
                bars, i, parent, seen.get(parent, 0), source(i), None if trial is None else trial.r))
            seen[parent] = seen.get(parent, 0) + 1
    path = [i for i, d in enumerate(event.drafts) if d.verdict.value == "accepted"]
    n = len(path)
    rejected = bool(result.rejected) if result is not None else any(d.verdict.value == "rejected"
                                                                     for d in event.drafts)
    if len(event.emitted) > n:  # the target's own token was emitted (not cut by EOS or the length cap)
        own = event.emitted[-1]
        p_n = p_rows[path[-1] + 1 if path else 0]
        r = result.next_probs if result is not None and result.rejected else None
        top = _top(*((r, p_n) if r is not None else (p_n,)), must=(own.token_id,))
        top.sort(key=lambda t: -float((r if r is not None else p_n)[t]))
        positions.append(PositionView(
            n, own.verdict.value, own.token_id, own.text, own.verdict.value, None, own.p_target, None, None,
            text_of(int(torch.argmax(p_n))) if greedy else None,
            _bars(top, torch.zeros_like(p_n), p_n, r, text_of), parent=path[-1] if path else -1))
    return CycleView(event.step, greedy, event.gamma, positions, [t.text for t in event.emitted], event.n_accepted,
                     rejected, event.finish_reason, tree=prop is not None)


def run_to_end(session: TeachSession) -> list[CycleView]:
    views = []
    while (view := advance(session)) is not None:
        views.append(view)
    return views
