"""DFlash training variants the `train` command does not offer, for the search in issue 52: its decoder layers
started from copies of the target's layers (instead of a random start), and the loss's weighting of later slots.

    python experiments/probes/dflash_variant.py --start-layers 28,29 [--decay 0] -- <train dflash arguments>

--start-layers i,j: layer n of the drafter starts as the target's layer i_n (attention projections, MLP and both
norms; the drafter's own q/k norms stay at one); --decay G: slot k's loss weighted exp(-(k-1)/G), 0 = every slot
alike (the paper's G is 4 for blocks of 8). Everything after `--` goes to `python -m specviz train dflash` as is.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, so `specviz` imports from there

from specviz.cli.main import main  # noqa: E402
from specviz.drafters import dflash as dflash_module  # noqa: E402
from specviz.train import dflash as dflash_train  # noqa: E402


def started_from(layers: list[int]):
    def from_target(cfg, target_model):
        module = dflash_module.DFlash(cfg)
        decoder = target_model.get_decoder()
        if len(layers) != cfg.num_hidden_layers:
            raise SystemExit(f"--start-layers names {len(layers)} layers; the drafter has {cfg.num_hidden_layers}")
        for mine, index in zip(module.layers, layers):
            missing, unexpected = mine.load_state_dict(decoder.layers[index].state_dict(), strict=False)
            assert not unexpected and set(missing) <= {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}, \
                (missing, unexpected)
        print(f"drafter layers started from target layers {layers}", flush=True)
        return module
    return staticmethod(from_target)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--start-layers", default="")
    p.add_argument("--decay", type=float, default=None)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.start_layers:
        # build_module starts a module from the target where its class has from_target (as DraftLM has)
        setattr(dflash_module.DFlash, "from_target", started_from([int(x) for x in a.start_layers.split(",")]))
    if a.decay is not None:
        dflash_train.decay = (lambda bs: math.inf) if a.decay == 0 else (lambda bs: a.decay)
        print(f"slot weighting: decay {a.decay or 'none (uniform)'}", flush=True)
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    raise SystemExit(main(["train", "dflash", *rest]))
