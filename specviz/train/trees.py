"""A trained drafter's candidate tree, chosen from measurement: its held-out accuracy by depth (EAGLE) or head
(Medusa) and rank, and the target's verify profile T(k) with the drafter's measured cost."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from specviz import methods, metrics
from specviz.config import DEFAULT_TARGET
from specviz.drafters import trained as drafters
from specviz.drafters.config import DrafterError
from specviz.paths import ASSETS, PROFILES
from specviz.train.losses import eagle_depth_accuracy

PROFILE = PROFILES / "profile-bf16.json"   # T(k) and drafter costs on 2 CPU cores, where the drafters ship


def profile_for(target_name: str, path: Path | None = None) -> tuple[metrics.CostProfile, dict] | None:
    """A verify profile and drafter costs (`python -m specviz profile --json`): the file at path, which must be the
    target's (DrafterError otherwise), or by default the committed one of the default target in its default CPU
    dtype (assets/profiles/profile-bf16.json), None for other targets."""
    if path is None:
        if target_name != DEFAULT_TARGET or not PROFILE.is_file():
            return None
        path = PROFILE
    try:
        d = json.loads(Path(path).read_text())
        profile = metrics.CostProfile(**d["profile"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DrafterError(f"profile {str(path)!r} is not a verify profile written by `python -m specviz "
                                    f"profile --json` ({type(exc).__name__}: {exc})") from None
    if d.get("target", target_name) != target_name:
        raise DrafterError(f"profile {str(path)!r} was measured on target {d['target']!r}, "
                                    f"not on the drafter's target {target_name!r}")
    return profile, {c["method"]: c.get("c") for c in d.get("costs", [])}


def choose_eagle_tree(cfg, module, head, embed, held_batch, target_name: str, log) -> None:
    """EAGLE's candidate tree from measurement: its per-depth, per-rank accuracy on held-out answers and the
    target's verify profile T(k) (with the drafter's cost per level): the tree with the most expected tokens per
    unit of time. Without a profile for the target it drafts a chain."""
    accuracy = eagle_depth_accuracy(module, head, embed, held_batch)
    module.train()
    cfg.training["depth_rank_accuracy_held_out"] = [[round(float(a), 3) for a in row] for row in accuracy]
    log("held-out accuracy by depth (rank 0..3): "
        + "; ".join(" ".join(f"{float(a):.2f}" for a in row) for row in accuracy))
    choose_tree_for_cost(cfg, accuracy, target_name, cfg.kind, log)


def choose_tree_for_cost(cfg, accuracy: torch.Tensor, target_name: str, kind: str, log, max_size: int = 32,
                         profile_path: Path | None = None) -> None:
    """cfg.tree := the tree with the most expected tokens per unit of time (drafters.tree_for_cost) from the
    held-out accuracy[depth, rank] and a verify profile (default: the committed one) with the drafter's measured
    cost: per tree level for EAGLE, once per step for Medusa. Without a profile for the target the tree stays."""
    found = profile_for(target_name, profile_path)
    if found is None or not len(accuracy):
        return
    profile, costs = found
    cost = costs.get(kind) or 0.1
    per_level = methods.spec(kind).tree_from == "depths"  # EAGLE drafts a tree level by level, Medusa once a step
    tree, tokens, speed = drafters.tree_for_cost(accuracy, profile.ratio, cost if per_level else 0.0,
                                                 max_size=max_size, step_cost=0.0 if per_level else cost)
    cfg.tree = [list(p) for p in tree]
    cfg.training["tree_choice"] = {"nodes": len(tree), "expected_tokens_per_step": round(tokens, 3),
                                   "predicted_speedup": round(speed, 3),
                                   ("draft_cost_per_level" if per_level else "draft_cost_per_step"): round(cost, 3),
                                   "profile": str(PROFILE.relative_to(ASSETS.parent) if profile_path is None
                                                  else profile_path)}
    log(f"tree: {len(tree)} nodes, {tokens:.2f} expected tokens per step, predicted {speed:.2f}× AR")
