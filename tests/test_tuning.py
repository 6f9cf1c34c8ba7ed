"""The default race chosen from the machine's own T(k): the rule, driven by a fast and a slow verify profile."""
from __future__ import annotations

import pytest

from specviz import tuning
from specviz.metrics import CostProfile

SIZES = [1, 2, 3, 4, 5, 6, 8, 12, 17]


def profile(ratios: list[float]) -> CostProfile:
    seconds = [0.010 * r for r in ratios]
    return CostProfile("cpu", "bfloat16", "fused", 128, 3, SIZES, seconds, seconds)


# an AVX512-BF16-like host: rows nearly free up to 8; an AVX2-like host: each row past 3 costs its arithmetic
FAST = profile([1.0, 1.02, 1.04, 1.06, 1.08, 1.10, 1.15, 1.35, 1.6])
SLOW = profile([1.0, 1.07, 1.53, 1.77, 2.05, 2.3, 3.0, 4.2, 5.6])
FLAT_COSTS = tuning.StepCosts(lanes={"pld": 0.02, "eagle": 0.15, "eagle2": 0.27, "grafts": 0.20})

# a grid as race_grid.py writes it: the big tree keeps more a step and verifies many more rows
GRID = {
    "pld:1": tuning.GridRace("pld:1", 100, 125, {1: 50, 2: 50}),
    "pld:2": tuning.GridRace("pld:2", 100, 135, {1: 50, 3: 50}),
    "eagle:1": tuning.GridRace("eagle:1", 100, 150, {3: 100}),
    "eagle:1+pld:4+ret:4": tuning.GridRace("eagle:1+pld:4+ret:4", 100, 225, {6: 50, 9: 50}),
}


def test_race_names_round_trip():
    for g, lookup, retrieve in [(0, 2, 0), (1, 0, 0), (1, 4, 4), (2, 6, 0), (2, 0, 6)]:
        assert tuning.parse_race(tuning.race_name(g, lookup, retrieve)) == (g, lookup, retrieve)
        assert tuning.parse_nodes(tuning.race_name(g, lookup, retrieve)) == 0
    name = tuning.race_name(3, 8, 0, 32)
    assert name == "eagle:3+pld:8+dyn:32" and tuning.parse_race(name) == (3, 8, 0) and tuning.parse_nodes(name) == 32
    name = tuning.race_name(7, 4, 2, 8, "dflash")
    assert name == "dflash:7+pld:4+ret:2+dyn:8" and tuning.parse_race(name) == (7, 4, 2)
    assert tuning.parse_nodes(name) == 8
    assert [tuning.race_drafter(n) for n in (name, "eagle:1+pld:4", "pld:3")] == ["dflash", "eagle", "pld"]
    assert set(tuning.candidates((1,), (0, 2), (0, 4))) == {"pld:2", "eagle:1", "eagle:1+pld:2", "eagle:1+ret:4",
                                                            "eagle:1+pld:2+ret:4"}


def test_predict_is_tokens_over_step_cost():
    race = GRID["eagle:1+pld:4+ret:4"]
    expected = 2.25 / ((FAST.ratio(6) + FAST.ratio(9)) / 2 + 0.20)  # c: EAGLE 0.15 + the branches 0.05
    assert tuning.predict(race, FAST, FLAT_COSTS) == pytest.approx(expected)
    assert tuning.predict(race, FAST, FLAT_COSTS) > tuning.predict(race, SLOW, FLAT_COSTS)


def test_a_fast_host_races_the_big_tree_and_a_slow_one_a_small_race():
    fast = tuning.choose(GRID, FAST, FLAT_COSTS)
    assert fast.race == "eagle:1+pld:4+ret:4" and fast.method == "eagle" and fast.pays
    assert (fast.gamma, fast.lookup, fast.retrieve) == (1, 4, 4)
    slow = tuning.choose(GRID, SLOW, FLAT_COSTS)
    assert slow.race == "pld:1" and slow.method == "pld" and slow.gamma == 1 and slow.pays
    assert slow.predicted == max(tuning.predict(r, SLOW, FLAT_COSTS) for r in GRID.values())
    assert "eagle:1+pld:4+ret:4" not in slow.race and "best EAGLE tree" in slow.line()


def test_a_tree_in_a_near_tie_with_the_best_chain_is_chosen():
    """Where the best chain is predicted faster than every tree by less than TIE, and the tree pays, the tree races."""
    for c in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6):  # dearer EAGLE steps until the chain leads a little
        costs = tuning.StepCosts(lanes={"pld": 0.02, "eagle": c, "eagle2": c + 0.12, "grafts": c + 0.05})
        speed = {n: tuning.predict(r, FAST, costs) for n, r in GRID.items()}
        tree = max((n for n in GRID if GRID[n].shape[0]), key=speed.get)
        chain = max((n for n in GRID if not GRID[n].shape[0]), key=speed.get)
        if speed[chain] > speed[tree] > 1.0:
            break
    else:
        raise AssertionError("no cost makes the chain lead while the tree pays")
    near = 1.0 - speed[tree] / speed[chain]
    for tie, expected in ((near + 0.01, tree), (max(near - 0.01, 0.0), chain)):
        old, tuning.TIE = tuning.TIE, tie
        try:
            assert tuning.choose(GRID, FAST, costs).race == expected, (tie, near)
        finally:
            tuning.TIE = old


def test_nothing_pays_races_the_best_chain_and_says_so():
    costly = tuning.StepCosts(lanes={"pld": 0.3, "eagle": 0.9, "eagle2": 1.5, "grafts": 1.0})
    choice = tuning.choose(GRID, SLOW, costly)
    assert not choice.pays and choice.method == "pld" and choice.predicted < 1.0
    assert "nothing predicted faster than AR" in choice.line()
    # with cheaper rows the same drafts pay
    assert tuning.choose(GRID, FAST, costly).pays


def test_rows_that_cost_more_in_a_race_than_profiled_move_the_choice_to_fewer_rows():
    """The calibration's row excess e prices a forward of k rows at 1 + (1 + e)(T(k)/T(1) − 1): with e 0 the
    prediction is the profile's, and the larger e the fewer rows the chosen race verifies."""
    race = GRID["eagle:1+pld:4+ret:4"]
    dear = tuning.StepCosts(lanes=FLAT_COSTS.lanes, row_excess=1.0)
    assert dear.forward(FAST, 1) == 1.0 and dear.forward(FAST, 9) == pytest.approx(2 * FAST.ratio(9) - 1)
    assert tuning.predict(race, FAST, dear) < tuning.predict(race, FAST, FLAT_COSTS)
    rows = [tuning.choose(GRID, FAST, tuning.StepCosts(FLAT_COSTS.lanes, row_excess=e)).rows for e in (0, 5, 10)]
    assert rows[0] > rows[2] and rows == sorted(rows, reverse=True)


def test_the_row_excess_is_one_slope_over_every_family_about_its_own_means():
    # two families with their own intercepts (c) and one slope 0.5; a family whose rows never vary adds nothing
    points = {"pld": [(x, 0.02 + 0.5 * x) for x in (0.0, 0.1, 0.2)],
              "eagle": [(x, 0.30 + 0.5 * x) for x in (0.2, 0.4, 0.6)],
              "flat": [(0.3, 0.9), (0.3, 0.1)]}
    assert tuning.row_slope(points) == pytest.approx(0.5)
    assert tuning.row_slope({"pld": [(x, -x) for x in (0.0, 0.5)]}) == 0.0  # never below the profile
    assert tuning.row_slope({"pld": [(0.2, 0.1), (0.2, 0.3)]}) == 0.0         # no spread in x


def test_step_costs_are_linear_in_levels_and_add_the_branches():
    assert FLAT_COSTS.of(0, 3, 0) == 0.02
    assert FLAT_COSTS.of(1, 0, 0) == pytest.approx(0.15)
    assert FLAT_COSTS.of(2, 0, 0) == pytest.approx(0.27)
    assert FLAT_COSTS.of(2, 4, 0) == pytest.approx(0.27 + 0.05)


def test_the_shipped_grid_is_consistent():
    grid = tuning.load_grid("smollm2-135m")
    assert grid is not None and "pld:2" in grid and "eagle:1+pld:4+ret:4" in grid
    for race in grid.values():
        assert race.steps == sum(race.rows.values()) and race.tau >= 1.0
        g, lookup, retrieve = race.shape
        # a tree's own nodes: a dynamic tree's count, EAGLE's stored tree (3 nodes) or DFlash's chain (g) cut to depth g
        assert min(race.rows) >= 1 and max(race.rows) <= 1 + (race.nodes or max(g, 3)) * (g > 0) + lookup + retrieve
    # more branches never keep fewer tokens at the same positions
    assert grid["eagle:1+pld:4+ret:4"].tokens >= grid["eagle:1"].tokens
    assert tuning.load_grid("no-such-target") is None


def test_the_pair_takes_the_choice_for_the_default_and_for_each_method():
    from specviz.hardware import EMBEDDED_PAIR

    slow = EMBEDDED_PAIR.tuned(tuning.choose(GRID, SLOW, FLAT_COSTS))
    assert (slow.method, slow.gamma, slow.gamma_for("pld")) == ("pld", 1, 1)
    # a user who picks EAGLE gets its fastest tree here (the bare one: rows cost), not the starting guess's branches
    assert (slow.gamma_for("eagle"), slow.lookup_for("eagle"), slow.retrieve_for("eagle")) == (1, 0, 0)
    assert slow.why.startswith("default race pld:1") and slow.target == EMBEDDED_PAIR.target
    fast = EMBEDDED_PAIR.tuned(tuning.choose(GRID, FAST, FLAT_COSTS))
    assert (fast.method, fast.gamma, fast.lookup_for(fast.method), fast.retrieve_for(fast.method)) == ("eagle", 1, 4, 4)
    assert fast.gamma_for("medusa") == EMBEDDED_PAIR.gamma_for("medusa")  # methods the grid does not time keep theirs
