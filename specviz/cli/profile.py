"""`python -m specviz profile`: what verifying k tokens costs here (T(k), core/profile.py), the roofline, and each
drafter's cost ratio c (engines/costs.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specviz.cli.common import InputError, int_arg, load_target


def cmd_profile(args) -> int:
    from specviz import hardware, metrics
    from specviz.core import profile, roofline
    from specviz.engines.costs import drafter_costs, format_costs

    sizes = profile.SIZES
    if args.sizes is not None:  # size 1 is measured too (verify_profile): T(k)/T(1) is over it
        sizes = tuple(sorted({int_arg("sizes", v, 1, 256) for v in args.sizes.split(",") if v.strip()}))
        if not sizes:
            raise InputError(f"sizes={args.sizes!r} is empty: give tokens per forward, 1..256, comma-separated, "
                             "e.g. 1,2,4,8")
    reps, context = int_arg("reps", args.reps, 1, 100), int_arg("context", args.context, 1, 4096)
    target = load_target(args)
    print(f"target {target.name} on {hardware.describe(target.device, target.dtype)}; verification: {target.guarantee} "
          f"(attention {target.attention}{', one-token steps padded to two rows' if target.pad_one_row else ''})")
    prof = profile.verify_profile(target, sizes, context, reps)
    print(profile.format_profile(prof))
    roof = roofline.roofline(target.model, target.dtype, prof, roofline.read_bandwidth(target.device))
    print(roofline.format_roofline(roof))
    costs = [] if args.no_drafters else drafter_costs(target, draft=args.draft)
    if costs:
        for row in costs:
            if row.get("c") is not None and row.get("alpha") is not None:
                block = row.get("block", 0)  # a block drafter pays c once a step, for at most block - 1 drafts
                gammas = range(1, block) if block else range(1, 17)
                row["best_gamma"] = metrics.best_gamma(row["alpha"], row["c"], prof, gammas, bool(block))
                row["predicted_speedup"] = metrics.profiled_speedup(row["alpha"], row["best_gamma"], row["c"], prof,
                                                                    bool(block))
        print(format_costs(costs))
    if args.json:
        out = {"command": "python -m specviz " + " ".join(sys.argv[1:]), "target": target.name,
               "hardware": hardware.describe(target.device, target.dtype), "cpu": hardware.cpu_name(),
               "guarantee": target.guarantee,
               "pad_one_row": target.pad_one_row, "profile": prof.to_dict(),
               "ratios": {str(k): prof.ratio(k) for k in prof.tokens}, "roofline": roof.to_dict(), "costs": costs}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0
