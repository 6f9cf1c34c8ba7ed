"""What each drafter's step costs against an AR step (c), measured through the engines on one built-in prompt:
`python -m specviz profile`'s second table. Beside the engines, since it builds them; T(k) is core/profile.py's."""
from __future__ import annotations

from typing import Optional

from specviz import engines, metrics
from specviz import methods as registry
from specviz.config import DecodeConfig
from specviz.errors import ConfigError
from specviz.models.loader import LoadedModel, ModelError

COST_PROMPT = "Explain how a refrigerator keeps food cold, step by step."
COST_METHODS = registry.names(lambda s: s.has_weights)  # the methods whose drafting costs a forward of weights


def drafter_cost(target: LoadedModel, method: str, ar_events: list, draft: Optional[str] = None,
                 max_new_tokens: int = 48) -> dict:
    """c for one method: seconds per draft forward / seconds per AR step (AR's events on the same prompt and
    settings given), from a greedy run on one built-in prompt (the engines' own timers), with its α."""
    ids = target.encode_prompt(COST_PROMPT)
    cfg = DecodeConfig(method=method, max_new_tokens=max_new_tokens)
    engine = engines.build(method, target, draft) if draft else engines.build(method, target)
    engines.generate(engine, ids, cfg.with_(max_new_tokens=4))  # first-call allocations are not billed
    cmp = metrics.compare(ar_events, engines.generate(engine, ids, cfg).events, method, True)
    return {"method": method, "c": cmp.cost_ratio, "alpha": cmp.spec.alpha, "tau": cmp.spec.tau,
            "block": getattr(engine, "block_size", 0),  # drafts its whole block in one forward: c once a step
            "draft_forwards": cmp.spec.draft_forwards, "ar_step_ms": 1000 * cmp.ar.seconds / max(cmp.ar.steps, 1)}


def drafter_costs(target: LoadedModel, methods=COST_METHODS, draft: Optional[str] = None,
                  max_new_tokens: int = 48) -> list[dict]:
    """drafter_cost for every method that has a drafter for this target (the shipped ones, the int8 copy),
    against one timed AR run."""
    ids = target.encode_prompt(COST_PROMPT)
    ar, cfg = engines.build("ar", target), DecodeConfig(method="ar", max_new_tokens=max_new_tokens)
    engines.generate(ar, ids, cfg.with_(max_new_tokens=4))  # warm-up, not timed
    ar_events = engines.generate(ar, ids, cfg).events
    out = []
    for method in methods:
        try:
            out.append(drafter_cost(target, method, ar_events,
                                    draft if registry.spec(method).uses_draft_model else None, max_new_tokens))
        except (ConfigError, ModelError) as exc:  # no drafter shipped for this target
            out.append({"method": method, "c": None, "skipped": str(exc)})
    return out


def format_costs(costs: list[dict]) -> str:
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["| method | c (draft forward / AR step) | α (γ=4, one prompt) | best γ here | predicted speedup at it |",
             "|---|---|---|---|---|"]
    for row in costs:
        lines.append(f"| {row['method']} | {f(row.get('c'), '.3f')} | {f(row.get('alpha'), '.2f')} | "
                     f"{f(row.get('best_gamma'), 'd')} | {f(row.get('predicted_speedup'), '.2f')}× |")
    return "\n".join(lines)
