"""`python -m specviz tree`: a trained Medusa or EAGLE drafter's tree re-chosen from measurement, without retraining
(train/loop.py trains; this re-reads its held-out split and a verify profile)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from specviz import methods
from specviz.core import answers
from specviz.drafters import trained as drafters
from specviz.drafters.config import DrafterError, read_config
from specviz.drafters.modules import load_into
from specviz.train import distill
from specviz.train.features import autocast, features_for
from specviz.train.loop import DEFAULT_DATA, TrainOptions, mixed_bf16, scored_batch
from specviz.train.losses import eagle_depth_accuracy, head_accuracy
from specviz.train.trees import choose_tree_for_cost, profile_for

TREE_HELD_OUT = 60  # held-out answers `tree` measures by default
CARD_LINE = "Tree re-chosen without retraining"  # how the model card's line about the last `tree --write` starts


def retree(folder: Path, data: list[str] | None = None, held: int = TREE_HELD_OUT, write: bool = False, log=print,
           target=None, profile: Path | None = None) -> dict:
    """A trained Medusa or EAGLE drafter's tree re-chosen from measurement without retraining: its rank accuracy
    (Medusa: per head; EAGLE: per draft depth, from its own features, as at training) on `held` held-out answers
    (the split training uses; default data: the committed ids) and a verify profile (choose_tree_for_cost; default:
    the committed one, or this machine's from `python -m specviz profile --json`). Returns {"old": tree, "new": tree,
    "accuracy": ...}; with write, config.json gets the new tree and the figures, and the model card a line saying so."""
    folder = Path(folder)
    raw = read_config(folder) if (folder / "config.json").is_file() else {}  # one line for a corrupt config.json
    if "kind" not in raw:
        raise DrafterError(f"{str(folder)!r} is not a drafter trained here (no config.json with a kind)")
    kind = raw["kind"]
    spec = methods.METHODS.get(kind)
    if spec is None or not spec.tree_from:
        raise DrafterError(f"drafter {str(folder)!r} is a {kind} drafter: only Medusa's and EAGLE's trees "
                                    "are re-chosen (the others draft a chain)")
    profile_for(raw["target"], profile)  # a bad profile file is reported before the features are computed
    from specviz.models import loader as models

    target = target or models.get(raw["target"], torch.device("cpu"), torch.float32, attention="sdpa")
    examples: list[dict] = []
    for f in data or [str(DEFAULT_DATA)]:
        examples += answers.read_chunks(f) if Path(f).is_dir() else answers.read_examples(f)
    held_out = distill.split(examples)[1][:held]
    if not held_out:
        raise DrafterError("no held-out examples in the data: give more (every 20th example is held out)")
    by_heads = spec.tree_from == "heads"  # Medusa: rank accuracy per head; EAGLE: per draft depth
    key = "head_rank_accuracy_held_out" if by_heads else "depth_rank_accuracy_held_out"
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():  # the features are a map of a file in tmp
        if by_heads:
            d = drafters.load(folder, target)
            cfg = d.cfg
            feats, seqs = features_for(held_out, target, Path(tmp) / "features.f16", log)
            accuracy = head_accuracy(d.module.float(), d.head_weight.float(), feats, seqs,
                                     [len(e["prompt_ids"]) for e in held_out])
        else:  # as training scores it: the training module, bf16 autocast where the CPU has it
            cfg, state = drafters.read_layout(folder, target)
            vocab_ids = state.pop("vocab_ids", None)
            module = drafters.build_module(cfg)
            load_into(module, state, str(folder))
            weight = target.model.get_output_embeddings().weight.detach().float()
            bf16 = mixed_bf16("auto")
            feats, seqs = features_for(held_out, target, Path(tmp) / "features.f16", log, tuple(cfg.feature_layers),
                                       bf16)
            with autocast(bf16):
                accuracy = eagle_depth_accuracy(module, weight if vocab_ids is None else weight[vocab_ids.long()],
                                                target.model.get_input_embeddings(),
                                                scored_batch(held_out, seqs, feats, len(held_out))).float()
    old = [list(p) for p in cfg.tree]
    cfg.training = dict(cfg.training)
    cfg.training[key] = [[round(float(a), 3) for a in row] for row in accuracy]
    choose_tree_for_cost(cfg, accuracy, cfg.target, kind, log,
                         max_size=max(len(old), TrainOptions.tree_size) if by_heads else 32, profile_path=profile)
    change = tree_change(old, cfg.tree)
    log(f"tree: {change}: {cfg.tree}")
    if write:
        raw["tree"] = cfg.tree
        raw["training"] = {**raw.get("training", {}), key: cfg.training[key],
                           "held_out_sequences_for_tree": len(held_out),
                           **({"tree_choice": cfg.training["tree_choice"]} if "tree_choice" in cfg.training else {})}
        (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        choice = cfg.training.get("tree_choice", {})
        given = ((f" --data {' '.join(data)}" if data else "")
                 + (f" --held-out {held}" if held != TREE_HELD_OUT else "")
                 + (f" --profile {profile}" if profile else ""))
        line = (f"{CARD_LINE} (`python -m specviz tree {folder}{given} --write`): "
                f"{change}, from the {'heads' if by_heads else 'draft depths'}' "
                f"rank accuracy on {len(held_out)} held-out answers and the verify profile "
                f"({choice.get('expected_tokens_per_step')} expected tokens per step, predicted "
                f"{choice.get('predicted_speedup')}x AR).")
        card_path = folder / "README.md"
        card_path.write_text(card_with(card_path.read_text() if card_path.is_file() else "", line))
    return {"old": old, "new": cfg.tree, "accuracy": cfg.training[key]}


def tree_change(old: list, new: list) -> str:
    """What re-choosing did to the tree, in words: "3 nodes instead of 2", or that it is unchanged."""
    old, new = [list(p) for p in old], [list(p) for p in new]
    if new == old:
        return f"unchanged ({len(new)} nodes)"
    return f"{len(new)} nodes instead of {len(old)}" if len(new) != len(old) else f"another tree of {len(new)} nodes"


def card_with(text: str, line: str) -> str:
    """The model card with its CARD_LINE line replaced by `line` (appended after a blank line when it has none);
    every other line kept as it was."""
    lines = text.splitlines()
    at = next((i for i, old in enumerate(lines) if old.startswith(CARD_LINE)), None)
    if at is None:
        return (text.rstrip("\n") + "\n\n" if text.strip() else "") + line + "\n"
    lines[at] = line
    return "\n".join(lines) + "\n"
