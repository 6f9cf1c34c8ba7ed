"""Races sized to what a row costs (issue 51): the grid's wide shapes (EAGLE-2 dynamic trees of 8-64 nodes, wide
grafts, deep chains) priced from the measured T(k), a sampled race priced by its own τ, and a run by its prefill."""
from __future__ import annotations

import pytest

from specviz import tuning
from specviz.metrics import CostProfile

SIZES = [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32]


def profile(ratios: list[float], sizes=SIZES) -> CostProfile:
    seconds = [0.010 * r for r in ratios]
    return CostProfile("cpu", "bfloat16", "rowwise", 128, 3, list(sizes), seconds, seconds)


# today's Zen 4 (experiments/results/profile-machine-avx512bf16.json, `profile --reps 7 --no-drafters`, rounded)
ZEN4 = profile([1.0, 1.0, 1.08, 1.12, 1.13, 1.13, 1.19, 1.59, 1.83, 2.51, 3.17])
# a host where rows are cheap (the AMX tile probe of issue 51): T(32)/T(1) = 1.1
CHEAP = profile([1.0, 1.0, 1.0, 1.0, 1.0, 1.01, 1.02, 1.03, 1.04, 1.07, 1.10])
# step costs outside the forward, in AR steps, of the size the calibrations here measure (the dynamic tree's step
# grows three levels and reranks 36 nodes: dearer than the stored tree's)
COSTS = tuning.StepCosts(lanes={"pld": 0.05, "eagle": 0.25, "eagle2": 0.40, "grafts": 0.30, "dyn": 0.60},
                         row_excess=0.3)
GRID = tuning.load_grid("smollm2-135m")


def test_the_shipped_grid_holds_the_wide_shapes_greedy_and_sampled():
    for name in ("eagle:3+dyn:16", "eagle:3+dyn:32", "eagle:3+pld:16+ret:16+dyn:64", "pld:16", "eagle:1+pld:16"):
        assert name in GRID and name in GRID.sampled
    assert GRID.sampling == (0.7, 0.95)
    # the same drafts keep fewer tokens when the target samples, and a bigger dynamic tree never keeps fewer
    assert GRID.sampled["eagle:1+pld:4+ret:4"].tau < GRID["eagle:1+pld:4+ret:4"].tau
    for grid in (GRID, GRID.sampled):
        taus = [grid[f"eagle:3+dyn:{n}"].tau for n in (8, 16, 24, 32, 48, 64)]
        assert taus == sorted(taus) and taus[-1] > grid["eagle:2"].tau


def test_cheap_rows_race_a_wide_race_and_todays_zen4_does_not():
    cheap = tuning.choose(GRID, CHEAP, COSTS)
    assert cheap.rows >= 12 and cheap.lookup >= 12 and cheap.pays, cheap.race
    assert cheap.sampled.rows >= 12 and cheap.sampled.lookup >= 12, cheap.sampled.race
    today = tuning.choose(GRID, ZEN4, COSTS)  # today's kind of race: EAGLE's stored tree, short branches
    assert today.rows < 8 and today.lookup <= 6 and today.nodes == 0 and today.pays, today.race
    assert today.sampled.rows < 8 and today.sampled.nodes == 0, today.sampled.race
    assert today.predicted < cheap.predicted


def test_a_dynamic_tree_races_where_rows_and_its_growing_are_cheap():
    """With the dynamic tree's step as dear as the stored tree's two levels, cheap rows race EAGLE-2's tree (with
    this drafter its first 8 nodes: past them τ grows by 0.15 for 56 more rows, table in docs/performance.md);
    today's Zen 4 T(k) does not."""
    costs = tuning.StepCosts({**COSTS.lanes, "dyn": COSTS.lanes["eagle2"]}, row_excess=0.3)
    cheap = tuning.choose(GRID, CHEAP, costs)
    assert cheap.nodes >= 8 and cheap.rows >= 16 and cheap.race.endswith(f"+dyn:{cheap.nodes}"), cheap.race
    assert tuning.choose(GRID, ZEN4, costs).nodes == 0


def test_a_calibration_without_the_dynamic_family_does_not_price_dynamic_trees():
    kept = tuning.StepCosts(lanes={k: v for k, v in COSTS.lanes.items() if k != "dyn"}, row_excess=0.3)
    speed = tuning.priced(GRID, CHEAP, kept)
    assert speed and not any(tuning.parse_nodes(n) for n in speed)
    assert tuning.choose(GRID, CHEAP, kept).nodes == 0
    with pytest.raises(KeyError):
        kept.of(3, 0, 0, 16)
    assert COSTS.of(3, 0, 0, 16) == pytest.approx(0.60) and COSTS.of(2, 4, 0, 16) == pytest.approx(0.60 - 0.15 + 0.05)


def test_a_sampled_race_is_priced_by_its_own_tau():
    choice = tuning.choose(GRID, ZEN4, COSTS)
    sampled = choice.sampled
    assert sampled.sampling == (0.7, 0.95) and choice.sampling == (0.0, 1.0)
    assert sampled.tau == GRID.sampled[sampled.race].tau
    assert sampled.predicted == pytest.approx(tuning.predict(GRID.sampled[sampled.race], ZEN4, COSTS))
    greedy_priced = tuning.predict(GRID[sampled.race], ZEN4, COSTS)
    assert sampled.predicted < greedy_priced  # the greedy τ would price the same race high
    assert "sampled (τ replayed at temperature 0.7, top-p 0.95)" in sampled.line() and "greedy" in choice.line()


def test_a_run_is_priced_with_its_prefill():
    # AR: prefill P steps then N − 1 steps; the race: the same prefill, the rest s times faster
    assert tuning.end_to_end(2.0, 0.0, 129) == pytest.approx(2.0)
    assert tuning.end_to_end(2.0, 30.0, 129) == pytest.approx((30 + 128) / (30 + 64))
    assert tuning.end_to_end(1.5, 10.0, 1) == 1.0
    costs = tuning.StepCosts(COSTS.lanes, row_excess=0.3, prefill=0.1)  # a prompt token: a tenth of an AR step
    choice = tuning.choose(GRID, ZEN4, costs)
    assert choice.prefill == pytest.approx(0.1)
    assert choice.run_speedup(128, 250) == pytest.approx(tuning.end_to_end(choice.predicted, 25.0, 128))
    assert choice.run_speedup(128, 250) < choice.predicted
    run = (f"predicted {choice.run_speedup(64, 100):.2f}x as fast as plain decoding on this machine over 64 tokens "
           f"after a 100-token prompt's prefill ({choice.predicted:.2f}x a decode step)")
    assert run in choice.line(64, 100)
    # a kept calibration without the prefill prices it from the verify profile, extrapolated
    assert COSTS.prefill_steps(ZEN4, 250) == pytest.approx(ZEN4.ratio(250))


def test_the_pair_races_the_chosen_dynamic_tree():
    from specviz.hardware import EMBEDDED_PAIR, method_spec

    costs = tuning.StepCosts({**COSTS.lanes, "dyn": COSTS.lanes["eagle2"]}, row_excess=0.3)
    pair = EMBEDDED_PAIR.tuned(tuning.choose(GRID, CHEAP, costs))
    assert pair.nodes_for("eagle") >= 8 and pair.race().endswith(f"+dyn:{pair.nodes_for('eagle')}")
    name, gamma, grafts, _, _ = method_spec(pair.race())
    assert (name, grafts["tree"], int(grafts["tree_nodes"])) == ("eagle", "dynamic", pair.nodes_for("eagle"))
    assert EMBEDDED_PAIR.tuned(tuning.choose(GRID, ZEN4, costs)).nodes_for("eagle") == 0


def test_a_kept_calibration_keeps_the_prefill_and_the_dynamic_family():
    from specviz import calibration

    costs = tuning.StepCosts(COSTS.lanes, {"eagle": 0.1}, 0.3, prefill=0.07)
    cal = calibration.Calibration({"cpu": "x"}, ZEN4, costs, 1e10, "2026-12-06 07:00")
    back = calibration.Calibration.from_json(cal.to_json())
    assert back.costs == costs and back.costs.lanes["dyn"] == 0.60
    old = cal.to_json().replace('"prefill": 0.07', '"prefill_gone": 0')  # kept before the prefill was measured
    assert calibration.Calibration.from_json(old).costs.prefill == 0.0


def test_a_sampled_run_adopts_and_prices_the_race_chosen_for_sampling(monkeypatch):
    from specviz import calibration, hardware
    from specviz.models import loader as models

    choice = tuning.choose(GRID, ZEN4, tuning.StepCosts(COSTS.lanes, row_excess=0.3, prefill=0.1))
    outcome = calibration.Outcome(choice, "kept", f"{choice.line()}; from this machine's calibration")
    monkeypatch.setattr(calibration, "calibrate", lambda target, say=None: outcome)
    monkeypatch.setattr(hardware, "_tuned", {})

    class Target:
        name, device = "smollm2-135m", __import__("torch").device("cpu")
        dtype = models.default_dtype(device)

    line = hardware.adopt(Target(), temperature=0.7, new_tokens=64, prompt_tokens=120)
    assert line == f"{choice.sampled.line(64, 120)}; from this machine's calibration"
    assert hardware.default_pair(Target.device).why == choice.sampled.line()
    assert hardware.adopt(Target()) == outcome.line  # greedy: the greedy choice at a typical run
    assert hardware.default_pair(Target.device).why == choice.line()


def test_a_left_out_tree_is_the_chosen_dynamic_tree_in_generate_and_the_app(monkeypatch):
    """Where this machine races EAGLE-2's dynamic tree, `generate` without --tree, the app's form (the method's
    fields and the "best" preset) run it too, not the stored tree; a given --tree still wins."""
    import argparse

    from specviz import hardware
    from specviz.cli import common
    from specviz.ui import presets, race

    costs = tuning.StepCosts({**COSTS.lanes, "dyn": COSTS.lanes["eagle2"]}, row_excess=0.3)
    pair = hardware.EMBEDDED_PAIR.tuned(tuning.choose(GRID, CHEAP, costs))
    nodes = pair.nodes_for("eagle")
    assert nodes and pair.tree_for("eagle") == ("dynamic", nodes) and pair.tree_for("pld")[0] == "static"
    monkeypatch.setattr(hardware, "default_pair", lambda device=None: pair)
    p = argparse.ArgumentParser()
    common.decode_args(p)
    cfg = common.config_of(p.parse_args([]), "eagle")
    assert (cfg.tree, cfg.tree_nodes) == ("dynamic", nodes)
    given = common.config_of(p.parse_args(["--tree", "static"]), "eagle")
    assert given.tree == "static"
    best = presets.race(pair, "eagle")
    assert (best["tree"], best["tree_nodes"]) == ("dynamic", nodes)
    assert presets.race(pair, "eagle", branches=False)["tree"] == "static"  # EAGLE alone: its stored tree
    fields = race.method_changed("eagle")
    assert fields["tree"]["value"] == "dynamic" and fields["tree_nodes"]["value"] == str(nodes)


def test_a_race_never_costs_less_than_its_drafting_however_the_fit_falls():
    """A loaded host's calibration (kept as measured beside a training run): the dynamic family's fitted intercept
    -1.38 AR steps, a steep row slope. Each race's cost outside its forward is floored at its family's drafting,
    timed alone, so no race is predicted faster than its τ over its forward plus its drafting."""
    lanes = {"pld": -0.197, "eagle": -0.113, "eagle2": 0.037, "grafts": -0.060, "dyn": -1.376}
    draft = {"pld": 0.011, "eagle": 0.089, "eagle2": 0.164, "grafts": 0.113, "dyn": 0.315}
    costs = tuning.StepCosts(lanes, draft, row_excess=1.68, prefill=0.089)
    assert costs.of(2, 0, 0, 8) == pytest.approx(0.315) and costs.of(0, 4, 0) == pytest.approx(0.011)
    assert costs.of(1, 4, 2) >= 0.113 and costs.of(1, 0, 0) >= 0.089
    for race in map(GRID.get, tuning.priced(GRID, ZEN4, costs)):  # DFlash's: no lane in this calibration
        per_step = sum(n * (costs.forward(ZEN4, k) + draft["pld" if not race.shape[0] else "eagle"])
                       for k, n in race.rows.items()) / race.steps
        assert tuning.predict(race, ZEN4, costs) <= race.tau / per_step + 1e-9, race.name
    choice = tuning.choose(GRID, ZEN4, costs)
    assert choice.predicted < 2.0, choice.line()


def test_dflash_races_its_measured_dynamic_tree_and_keeps_it_when_the_machine_is_tuned():
    from specviz.hardware import EMBEDDED_PAIR, method_spec

    assert EMBEDDED_PAIR.race("dflash") == "dflash:7+pld:4+ret:2+dyn:8"
    name, gamma, grafts, _, _ = method_spec(EMBEDDED_PAIR.race("dflash"))
    assert (name, int(gamma), grafts["tree"], int(grafts["tree_nodes"])) == ("dflash", 7, "dynamic", 8)
    tuned = EMBEDDED_PAIR.tuned(tuning.choose(GRID, ZEN4, COSTS))
    assert tuned.race("dflash") == EMBEDDED_PAIR.race("dflash") and tuned.tree_for("eagle")[0] == "static"
    # priced too (its calibration lane), and not chosen: a user who picks DFlash still sees its whole block
    priced = tuning.choose(GRID, ZEN4, tuning.StepCosts({**COSTS.lanes, "dflash": 0.35}, row_excess=0.3))
    assert "dflash" in dict((d, n) for d, n, _ in priced.best_races) and priced.method != "dflash"
    assert EMBEDDED_PAIR.tuned(priced).race("dflash") == EMBEDDED_PAIR.race("dflash")


def test_dflash_is_in_the_grid_and_priced_by_its_one_forward():
    """DFlash's races are replayed from its own recording (race_grid_wide.py --drafter dflash) into the same grid; a
    step costs its drafter forward whatever its depth and tree (its own calibration family), plus the branches; a
    calibration that ran no DFlash lane (kept from before, or a target without the drafter) prices none of them."""
    for name in ("dflash:7", "dflash:3", "dflash:7+pld:4+ret:2+dyn:8", "dflash:7+pld:8+ret:8+dyn:64"):
        assert name in GRID and GRID[name].drafter == "dflash", name
        assert name not in GRID.sampled  # replayed greedy only: a slot's own draft is no point mass when sampling
    assert GRID["dflash:7+dyn:16"].tau >= GRID["dflash:7"].tau >= GRID["dflash:1"].tau
    costs = tuning.StepCosts({**COSTS.lanes, "dflash": 0.35}, row_excess=0.3)
    assert costs.of(1, 0, 0, 0, "dflash") == costs.of(7, 0, 0, 0, "dflash") == costs.of(7, 0, 0, 32, "dflash") == 0.35
    assert costs.of(7, 4, 2, 8, "dflash") == pytest.approx(0.35 + COSTS.lanes["grafts"] - COSTS.lanes["eagle"])
    assert any(GRID[n].drafter == "dflash" for n in tuning.priced(GRID, ZEN4, costs))
    assert not any(GRID[n].drafter == "dflash" for n in tuning.priced(GRID, ZEN4, COSTS))


def test_a_cheap_block_races_dflash_and_the_pair_takes_each_drafters_fastest_race():
    """Where DFlash's forward is cheap beside EAGLE's steps, the rule races DFlash's fastest race and the tuned pair
    runs it by default; EAGLE's own fastest race stays what a user who picks EAGLE gets (and the line names it)."""
    from specviz.hardware import EMBEDDED_PAIR

    dear = {k: v + (1.5 if k in ("eagle", "eagle2", "grafts", "dyn") else 0.0) for k, v in COSTS.lanes.items()}
    costs = tuning.StepCosts({**dear, "dflash": 0.02}, row_excess=0.3)
    choice = tuning.choose(GRID, CHEAP, costs)
    assert choice.method == "dflash" and choice.race.startswith("dflash:") and choice.pays, choice.race
    best = dict((d, n) for d, n, _ in choice.best_races)
    assert best["dflash"] == choice.race and best["eagle"] == choice.best_tree
    assert f"best EAGLE tree {choice.best_tree}" in choice.line()
    tuned = EMBEDDED_PAIR.tuned(choice)
    assert tuned.method == "dflash" and tuned.race() == choice.race and tuned.race("eagle") == choice.best_tree
    assert choice.to_dict()["best_races"]["dflash"]["race"] == choice.race
    # the same machine with DFlash's forward as dear as measured here keeps EAGLE's race
    today = tuning.choose(GRID, ZEN4, tuning.StepCosts({**COSTS.lanes, "dflash": 0.35}, row_excess=0.3))
    assert today.method != "dflash" and "best DFlash tree dflash:" in today.line(), today.line()


def test_bench_names_the_dynamic_tree_it_races(monkeypatch):
    """`bench --method dflash` races DFlash's whole block as a dynamic tree (hardware.CPU_TREES): its label says so,
    γ and nodes written in beside the branches, where EAGLE's stored tree names only its branches. An entry that
    writes its γ is a race as the start line names one (tuning.race_name): without +dyn, the stored tree (DFlash's
    first γ slots as a chain), so the race the start line calls DFlash's fastest is the race bench runs."""
    import argparse

    from specviz import hardware
    from specviz.cli import bench

    monkeypatch.setattr(hardware, "default_pair", lambda device=None: hardware.EMBEDDED_PAIR)
    args = argparse.Namespace(device=None, lookup=None, retrieve=None, tree=None, tree_nodes=None, tree_depth=3,
                              tree_topk=4, gamma=None, temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=16, seed=0,
                              drafter=None, draft=None)
    assert bench._in_full("dflash", args) == "dflash:7+pld:4+ret:2+dyn:8"
    assert bench._in_full("dflash:5@D", args) == "dflash:5+pld:4+ret:2@D"
    best = tuning.race_name(1, 4, 2, drafter="dflash")  # no +dyn: the chain of its first slot, with both branches
    assert bench._in_full(best, args) == best
    configs = bench._bench_configs(bench._bench_methods([best, "dflash", "dflash:5+dyn:12"], args), args)
    assert [(c.gamma, c.tree, c.tree_nodes) for c in configs.values()] == [(1, "static", 8), (7, "dynamic", 8),
                                                                           (5, "dynamic", 12)]
    args.tree = "dynamic"  # --tree says otherwise
    assert bench._in_full("dflash:5", args) == "dflash:5+pld:4+ret:2+dyn:8"
    args.tree = None
    assert bench._in_full("dflash:3+dyn:16", args) == "dflash:3+dyn:16+pld:4+ret:2"  # its own tree, as given
    assert bench._in_full("eagle", args) == "eagle+pld:4+ret:4" and bench._in_full("pld", args) == "pld"


def test_bench_races_a_race_named_twice_once_and_says_so_in_text(monkeypatch, capsys):
    """`bench --method default pld:4` where the default race is pld:4 printed `races ['pld:4', 'pld:4']` (a Python
    list) and merged the two into one row without a word: the races are written as text, and a race named twice
    (known only once `default` is resolved on this machine) runs once, in one row, with a line saying so."""
    import argparse

    from specviz import hardware
    from specviz.cli import bench

    monkeypatch.setattr(hardware, "default_pair", lambda device=None: hardware.EMBEDDED_PAIR)
    args = argparse.Namespace(device=None, lookup=None, retrieve=None, tree=None, tree_nodes=None, tree_depth=3,
                              tree_topk=4, gamma=None, temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=16, seed=0,
                              drafter=None, draft=None)
    race = hardware.EMBEDDED_PAIR.race()
    assert bench._races(["default", race, "pld:4"], args) == [race, "pld:4"]
    err = capsys.readouterr().err
    assert f"bench --method default {race} pld:4 races {race} {race} pld:4\n" in err and "[" not in err, err
    assert f"names {race} more than once: each race runs once, in one row" in err
    assert bench._races(["pld:4", "vanilla:2"], args) == ["pld:4", "vanilla:2"] and not capsys.readouterr().err
