"""The default race, chosen on the machine it runs on.

Whether speculation pays depends on two things that move apart: the drafts (how many tokens a race keeps a step and
how many rows it verifies for them) and the machine (what verifying k rows costs against one step, T(k)/T(1), and what
drafting costs). The first half is measured once and shipped: with greedy decoding, a race's rows and kept tokens per
step depend on the drafts and the target's tokens only, so experiments/probes/race_grid_wide.py replays every
candidate race on held-out prompts into assets/profiles/race-grid-<target>.json (a histogram of rows a step and the
tokens kept): prompt lookup's chains and EAGLE's trees from one recording, DFlash's blocks from one of its own. The
second half is measured here, once per machine (specviz/calibration.py keeps it in a cache file): the verify profile
T(k) (core/profile.py) and, from short greedy runs of AR and of each lane family interleaved, what a step costs
outside the target's forward (drafting, grafting, the verdicts and bookkeeping) in AR steps. The predicted
speed of a race over this machine's AR is then

    speedup = (tokens kept / steps) / mean over steps of (1 + (1 + e)(T(rows)/T(1) − 1) + c_lane)

with c_lane a lane's step in AR steps less what its forward costs, and e how much more a row costs inside a race than
the profile says (both fitted to the calibration runs: measure_costs). The choice maximises it and never picks a race
predicted slower than AR: where nothing pays it says so and races the best chain (prompt lookup), the cheapest to
verify.

torch and the engines are imported inside the functions: importing this module stays cheap.
"""
from __future__ import annotations

import functools
import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from specviz import methods as registry
from specviz.methods import drafts_block
from specviz.paths import PROFILES

GRID_FILE = "race-grid-{target}.json"
# a near tie: the predictions run 5-26% above Spec-Bench's measured speedups, prompt lookup's the most, and repeated
# runs differ by ~5% (experiments/LOG.md), so a drafter's tree predicted within 10% of the best chain is not known to be
# slower; it is chosen, as its gain does not hang on the text repeating itself (first draft right on new text: EAGLE
# 0.37, prompt lookup 0.24). Paired on Spec-Bench 48: AVX512-BF16 eagle:1+pld:4+ret:2 1.50x against pld:6 1.32x
# (predicted 1.45x and 1.54x at start-up); AVX2 eagle:1+pld:2 1.23x against pld:4 1.20x (predicted 1.39x and 1.48x)
TIE = 0.10
DYNAMIC = "dyn"  # a race's +dyn:N (hardware.DYNAMIC): EAGLE-2's dynamic tree of N nodes
CHAIN = "pld"   # the race where nothing pays: the chain cheapest to verify and to draft
TREE = "eagle"  # the tree drafter whose fastest race is Choice.best_tree (EAGLE's defaults when a user picks it)
COST_TOKENS = 16  # tokens of each calibration run (after a 4-token warm-up not billed)
COST_ROUNDS = 3   # runs of each lane, interleaved
# the calibration runs' prompt: a passage and a question, so that rows are priced at a context of a few hundred
# tokens, as Spec-Bench's and the app's prompts are (a row's attention grows with the context; on a short prompt the
# predictions ran 12-15% above the measured speedups)
CALIBRATION_PROMPT = (
    "Read the passage, then answer the question.\n\n"
    "A refrigerator does not make cold; it moves heat. A refrigerant circulates in a closed loop through four parts. "
    "The compressor squeezes the refrigerant vapour, which raises its pressure and temperature. In the condenser "
    "coils at the back of the appliance the hot vapour gives its heat to the room and condenses into a liquid. The "
    "liquid then passes through an expansion valve, where its pressure drops suddenly and it cools well below the "
    "temperature of the food compartment. In the evaporator coils inside the cabinet the cold refrigerant absorbs "
    "heat from the air and the food and boils back into a vapour, which returns to the compressor, and the cycle "
    "starts again. A thermostat switches the compressor on and off to hold the set temperature, and the insulated "
    "walls and door seals slow the heat that leaks back in. Defrost heaters melt the frost that builds up on the "
    "evaporator, and a fan spreads the cold air evenly through the shelves.\n\n"
    "Question: explain, step by step, how the refrigerator keeps the food cold, and why the back of it feels warm.")
# one run per lane family, (method, γ, lookup, retrieve): the per-step cost outside the target's forward of every
# candidate is read from these. A drafter that drafts its block in one forward (methods.drafts_block: DFlash) is its
# own family, run at its whole block: its drafting does not grow with γ, so one run prices all its races
COST_LANES = {"pld": (CHAIN, 2, 0, 0), "eagle": (TREE, 1, 0, 0), "eagle2": (TREE, 2, 0, 0), "grafts": (TREE, 1, 4, 4),
              "dyn": (TREE, 3, 0, 0), "dflash": ("dflash", 7, 0, 0)}
SLOPE_FAMILIES = ("pld", "eagle", "eagle2", "grafts")  # the static families, each a few rows: the row slope's fit
DYN_FAMILY = "dyn"  # the family run as EAGLE-2's dynamic tree (DYN_NODES nodes, grown 3 levels): its step pays the
DYN_NODES = 16      # growing (a drafter call per level over up to 4 nodes, the rerank), which no static lane does


def race_name(g: int, lookup: int, retrieve: int, nodes: int = 0, drafter: str = TREE) -> str:
    """A race as bench's --method writes it: pld:L, or eagle:g[+pld:L][+ret:R][+dyn:N] (N > 0: EAGLE-2's dynamic
    tree of N nodes, grown g levels; else the drafter's stored tree cut to depth g); `drafter` another tree drafter
    (dflash:g...: its block's first g slots)."""
    if not g:
        return f"{CHAIN}:{lookup}"
    return (f"{drafter}:{g}" + (f"+pld:{lookup}" if lookup else "") + (f"+ret:{retrieve}" if retrieve else "")
            + (f"+{DYNAMIC}:{nodes}" if nodes else ""))


def candidates(depths, lookups, retrieves) -> dict[str, tuple[int, int, int]]:
    """Every race of the grid by name: prompt lookup alone at each γ, EAGLE's tree at each depth with each branch."""
    out = {race_name(0, n, 0): (0, n, 0) for n in lookups if n}
    out.update({race_name(g, n, r): (g, n, r) for g in depths for n in lookups for r in retrieves})
    return out


def parse_nodes(name: str) -> int:
    """The nodes of a race's dynamic tree (its +dyn:N); 0 for the drafter's stored tree and the chains."""
    return next((int(n) for kind, _, n in (p.partition(":") for p in name.split("+")) if kind == DYNAMIC), 0)


def parse_race(name: str) -> tuple[int, int, int]:
    """(g, lookup, retrieve) of a race name written by race_name (its dynamic tree's nodes: parse_nodes; its
    drafter: race_drafter)."""
    g = lookup = retrieve = 0
    for part in name.split("+"):
        kind, _, n = part.partition(":")
        if kind == CHAIN:  # a race name writes prompt lookup as the chain race does
            lookup = int(n)
        elif kind == "ret":
            retrieve = int(n)
        elif kind != DYNAMIC:  # the tree drafter, first
            g = int(n)
    return g, lookup, retrieve


def race_drafter(name: str) -> str:
    """The method a race name runs: its first part's (eagle, dflash; pld for prompt lookup's chain alone)."""
    return name.split("+")[0].partition(":")[0]


@dataclass(frozen=True)
class GridRace:
    name: str
    steps: int
    tokens: int                  # kept a step on average: tokens / steps = τ
    rows: dict[int, int]         # rows verified -> steps

    @property
    def tau(self) -> float:
        return self.tokens / self.steps

    @property
    def mean_rows(self) -> float:
        return sum(k * n for k, n in self.rows.items()) / self.steps

    @property
    def shape(self) -> tuple[int, int, int]:
        return parse_race(self.name)

    @property
    def nodes(self) -> int:
        return parse_nodes(self.name)

    @property
    def drafter(self) -> str:
        return race_drafter(self.name)


class Grid(dict):
    """The races replayed greedy, by name (GridRace); `sampled`: the same races replayed on a sampled recording
    (experiments/probes/race_grid_wide.py) at `sampling` (temperature, top-p), {} where the grid has none."""
    sampled: dict[str, GridRace] = {}
    sampling: tuple[float, float] = (0.0, 1.0)


def _races(configs: dict) -> dict[str, GridRace]:
    return {name: GridRace(name, c["steps"], c["tokens"], {int(k): v for k, v in c["rows"].items()})
            for name, c in configs.items()}


@functools.lru_cache(maxsize=None)
def load_grid(target_name: str, folder: Path = PROFILES) -> Optional[Grid]:
    """The shipped race grid of a target (None where none is shipped: only the embedded target has one)."""
    path = Path(folder) / GRID_FILE.format(target=target_name)
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    grid = Grid(_races(d["configs"]))
    if "sampled" in d:
        grid.sampled = _races(d["sampled"]["configs"])
        grid.sampling = (float(d["sampled"]["temperature"]), float(d["sampled"]["top_p"]))
    return grid


@dataclass(frozen=True)
class StepCosts:
    """What a step costs on this machine outside the target's forward, in AR steps, per lane family (COST_LANES):
    a lane's step = one AR step × (T(rows)/T(1) + its cost here)."""
    lanes: dict[str, float]        # family -> median over steps of (step seconds / AR step seconds − T(rows)/T(1))
    draft: dict[str, float] = field(default_factory=dict)  # the drafting alone / AR step (the drafter's c)
    # how much more an extra row costs inside a race than the verify profile says: a race's forward of k rows costs
    # 1 + (1 + row_excess)(T(k)/T(1) − 1) AR steps (fitted over the calibration runs' steps; 0: as profiled)
    row_excess: float = 0.0
    # the calibration prompt's prefill (its first forward) in AR steps a prompt token (0: not measured, a calibration
    # kept before it was: the verify profile's T(k), extrapolated, prices it instead)
    prefill: float = 0.0

    def prefill_steps(self, profile, prompt_tokens: int) -> float:
        """A prompt's prefill in AR steps: what a run's speedup is diluted by (AR and a race pay it alike)."""
        return self.prefill * prompt_tokens if self.prefill > 0 else profile.ratio(prompt_tokens)

    def forward(self, profile, rows: int) -> float:
        """A race's target forward over `rows` rows, in AR steps, as the calibration runs measured it."""
        return 1.0 + (1.0 + self.row_excess) * (profile.ratio(rows) - 1.0)

    def of(self, g: int, lookup: int, retrieve: int, nodes: int = 0, drafter: str = TREE) -> float:
        """The per-step cost of a race outside its forward: prompt lookup alone; EAGLE at depth g, linear in its
        levels from depths 1 and 2, plus what the branches add (measured with both on); a dynamic tree (nodes > 0)
        from its own family's run at depth 3, a level less or more as the static levels differ; a drafter that
        drafts its block in one forward (DFlash) from its own family's run, whatever g and its tree, plus the
        branches. KeyError for a family the calibration ran none of (a kept one from before, a target without that
        drafter: such races are not priced)."""
        if not g:
            return max(self.lanes["pld"], self.floor("pld"))
        grafts = max(0.0, self.lanes["grafts"] - self.lanes["eagle"]) if (lookup or retrieve) else 0.0
        if drafts_block(drafter):
            return max(self.lanes[drafter] + grafts, self.floor(drafter))
        per_level = max(0.0, self.lanes["eagle2"] - self.lanes["eagle"])
        if nodes:
            return max(self.lanes[DYN_FAMILY] + (g - COST_LANES[DYN_FAMILY][1]) * per_level + grafts,
                       self.floor(DYN_FAMILY))
        return max(self.lanes["eagle"] + (g - 1) * per_level + grafts,
                   self.floor("grafts" if lookup or retrieve else "eagle2" if g > 1 else "eagle"))

    def floor(self, family: str) -> float:
        """The least a step of `family` costs outside its forward: its drafting, timed alone by the engines' own
        clocks (0 where not measured). The fitted intercepts are differences of noisy timings: on a loaded host
        (a training run on the other core) the dynamic tree's came out at -1.38 AR steps, extrapolated from 17 rows
        along a steep fitted row slope, and the start line predicted 4.94x."""
        return max(0.0, self.draft.get(family, 0.0))


def predict(race: GridRace, profile, costs: StepCosts) -> float:
    """The race's predicted speed over this machine's AR (module docstring)."""
    c = costs.of(*race.shape, race.nodes, race.drafter)
    per_step = sum(n * (costs.forward(profile, k) + c) for k, n in race.rows.items()) / race.steps
    return race.tau / per_step


def end_to_end(speedup: float, prefill: float, new_tokens: int) -> float:
    """A run's speedup over AR from a decode step's: both pay the prompt's prefill (`prefill` AR steps, which also
    yields the first token), then AR takes new_tokens − 1 steps and the race the same tokens `speedup` times faster."""
    rest = max(new_tokens - 1, 0)
    return (prefill + rest) / (prefill + rest / speedup) if prefill + rest > 0 else 1.0


PROMPT_TOKENS = 250  # a start line's prompt where the command has none: the calibration prompt's length, about


@dataclass(frozen=True)
class Choice:
    race: str                     # bench's --method syntax: "eagle:1+pld:4+ret:4", "pld:2", "eagle:3+dyn:32"
    method: str                   # DecodeConfig.method
    gamma: int
    lookup: int
    retrieve: int
    predicted: float              # over this machine's AR, a decode step's (no prefill)
    tau: float
    rows: float                   # verified a step, on average
    pays: bool                    # predicted faster than AR
    best_chain: str = ""          # the fastest prompt lookup race: prompt lookup's γ when a user picks it
    ratios: tuple[float, ...] = ()  # T(k)/T(1) for k = 2, 4, 8 on this machine
    nodes: int = 0                # the race's dynamic tree's nodes (0: the drafter's stored tree, or a chain)
    prefill: float = 0.0          # a prompt token's prefill in AR steps here (StepCosts.prefill_steps)
    sampling: tuple[float, float] = (0.0, 1.0)  # the (temperature, top-p) its τ was replayed at: 0 = greedy
    sampled: Optional["Choice"] = None  # the race chosen for sampling (temperature > 0), from the sampled grid
    # (drafter, its fastest race, predicted) for each tree drafter in the grid (the start line names them; EAGLE's is
    # what a user who picks EAGLE gets: hardware.Pair.tuned)
    best_races: tuple[tuple[str, str, float], ...] = ()

    @property
    def best_tree(self) -> str:
        """The fastest EAGLE race ("" where the grid priced none)."""
        return next((n for d, n, _ in self.best_races if d == TREE), "")

    @property
    def best_tree_predicted(self) -> float:
        return next((x for d, _, x in self.best_races if d == TREE), 0.0)

    def run_speedup(self, new_tokens: int = 128, prompt_tokens: int = PROMPT_TOKENS) -> float:
        """The predicted speedup of a whole run: new_tokens after a prompt of prompt_tokens (its prefill)."""
        return end_to_end(self.predicted, self.prefill * prompt_tokens, new_tokens)

    def line(self, new_tokens: int = 128, prompt_tokens: int = PROMPT_TOKENS) -> str:
        """One line: the race chosen and why, its prediction priced for a run of new_tokens after a prompt of
        prompt_tokens."""
        ks = [k for k, _ in zip((2, 4, 8), self.ratios)]
        t = (f"checking {', '.join(map(str, ks))} rows in one pass costs "
             f"{', '.join(f'{r:.2f}' for r in self.ratios)} times one row (T(k)/T(1))") if self.ratios else ""
        pace = f"{self.tau:.2f} tokens per target pass (τ), {self.rows:.1f} rows checked a pass"
        how = (f"sampled (τ replayed at temperature {self.sampling[0]:g}, top-p {self.sampling[1]:g})"
               if self.sampling[0] else "greedy")
        run = (f"{self.run_speedup(new_tokens, prompt_tokens):.2f}x as fast as plain decoding on this machine over "
               f"{new_tokens} tokens after a {prompt_tokens}-token prompt's prefill ({self.predicted:.2f}x a decode "
               "step)")
        if not self.pays:
            return (f"default race {self.race}: nothing predicted faster than AR (plain decoding) on this machine"
                    f"{'; ' + t if t else ''}; racing the best chain, predicted {run}, {how} ({pace})")
        tree = "".join(f"; best {registry.spec(d).label} tree {n} {x:.2f}x" for d, n, x in self.best_races
                       if n != self.race)
        return f"default race {self.race}: predicted {run}, {how} ({pace}{'; ' + t if t else ''}{tree})"

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("race", "method", "gamma", "lookup", "retrieve", "predicted", "tau",
                                             "rows", "pays", "best_tree", "best_tree_predicted", "best_chain",
                                             "nodes", "prefill")}
        return {**out, "best_races": {d: {"race": n, "predicted": x} for d, n, x in self.best_races},
                "sampled": self.sampled.to_dict() if self.sampled else None}


def priced(grid: dict[str, GridRace], profile, costs: StepCosts) -> dict[str, float]:
    """Each race's predicted speed over AR; the races this calibration cannot price (a dynamic tree where it ran
    none) left out."""
    speed = {}
    for name, race in grid.items():
        try:
            speed[name] = predict(race, profile, costs)
        except KeyError:
            continue
    return speed


def choose(grid: dict[str, GridRace], profile, costs: StepCosts) -> Choice:
    """The grid's race with the highest predicted speed, the best drafter's tree (EAGLE's, DFlash's) where it is
    predicted within TIE of it; where none is predicted faster than AR, the best chain. A Grid with a sampled replay
    also chooses the race for sampling from it (Choice.sampled)."""
    sampled = getattr(grid, "sampled", None)
    inner = _choose(sampled, profile, costs, getattr(grid, "sampling", (0.0, 1.0))) if sampled else None
    return replace(_choose(grid, profile, costs, (0.0, 1.0)), sampled=inner)


def _choose(grid: dict[str, GridRace], profile, costs: StepCosts, sampling: tuple[float, float]) -> Choice:
    speed = priced(grid, profile, costs)
    best = max(speed, key=speed.get)
    fastest: dict[str, str] = {}  # each tree drafter's fastest race
    for name in sorted((n for n in speed if grid[n].shape[0]), key=speed.get):
        fastest[grid[name].drafter] = name
    tree = max(fastest.values(), key=speed.get) if fastest else ""
    best_chain = max((n for n in speed if not grid[n].shape[0]), key=speed.get)
    if tree and speed[tree] > 1.0 and speed[tree] >= (1.0 - TIE) * speed[best]:
        best = tree
    pays = speed[best] > 1.0
    if not pays:
        best = best_chain
    g, lookup, retrieve = grid[best].shape
    ratios = tuple(round(profile.ratio(k), 2) for k in (2, 4, 8))
    return Choice(best, grid[best].drafter, g or lookup, lookup if g else 0, retrieve, speed[best], grid[best].tau,
                  grid[best].mean_rows, pays, best_chain, ratios,
                  grid[best].nodes, costs.prefill_steps(profile, PROMPT_TOKENS) / PROMPT_TOKENS, sampling,
                  best_races=tuple((d, n, speed[n]) for d, n in sorted(fastest.items())))


def measure_costs(target, profile, tokens: int = COST_TOKENS, rounds: int = COST_ROUNDS,
                  tick: Optional[Callable[[int, int], None]] = None) -> StepCosts:
    """StepCosts from short greedy runs of AR and of each COST_LANES family on one built-in prompt, interleaved in
    rounds (each round every lane once, so a slow spell of a shared machine falls on all of them alike) and timed by
    the engines' own clocks: each step's seconds over the median AR step, less what its forward costs. In a race a
    row costs more than the verify profile's back-to-back forwards say (measured 1.5 against 1.15 AR steps for 7 rows
    on a Zen 4: experiments/LOG.md), so the extra is fitted too: one slope over every lane's steps, x = T(rows)/T(1) −
    1 against y = step / AR step − T(rows)/T(1), each family its own intercept (its c), the slowest tenth of each
    family's steps left out (a shared machine's stalls); the AR runs' prefill priced a prompt token. `tick(done, of)` is
    called after each run."""
    from specviz import engines
    from specviz.config import DecodeConfig
    from specviz.errors import ConfigError
    ids = target.encode_prompt(CALIBRATION_PROMPT)
    lanes = {"ar": ("ar", DecodeConfig(method="ar", max_new_tokens=tokens))}
    for family, (method, gamma, lookup, retrieve) in COST_LANES.items():
        lanes[family] = (method, DecodeConfig(method=method, gamma=gamma, lookup=lookup, retrieve=retrieve,
                                              max_new_tokens=tokens))
    dyn = lanes[DYN_FAMILY][1]
    lanes[DYN_FAMILY] = (TREE, dyn.with_(tree="dynamic", tree_nodes=DYN_NODES, tree_depth=dyn.gamma))
    built = {}
    for family, (method, _) in list(lanes.items()):
        try:
            built[family] = engines.build(method, target)
        except ConfigError:  # a block drafter this target has none of: its races stay unpriced
            if not drafts_block(method):
                raise
            del lanes[family]
    for family, (_, cfg) in lanes.items():  # first-call allocations are not billed
        engines.generate(built[family], ids, cfg.with_(max_new_tokens=4))
    seen: dict[str, list] = {family: [] for family in lanes}
    prefills = []
    for r in range(rounds):
        for i, (family, (_, cfg)) in enumerate(lanes.items()):
            events = list(built[family].steps(ids, cfg))
            seen[family] += events[1:]  # the prefill step is no decode step
            if family == "ar":
                prefills.append(events[0].seconds)
            if tick:
                tick(r * len(lanes) + i + 1, rounds * len(lanes))
    ar_step = statistics.median(e.seconds for e in seen.pop("ar"))
    points, draft = {}, {}
    for family, events in seen.items():
        events = [e for e in events if e.drafts] or events
        xy = sorted(((profile.ratio(1 + len(e.drafts)) - 1.0, e.seconds / ar_step - profile.ratio(1 + len(e.drafts)))
                     for e in events), key=lambda p: p[1])
        points[family] = xy[:max(1, len(xy) - len(xy) // 10)]
        draft[family] = statistics.median(e.draft_s / ar_step for e in events)
    # the slope from the static families (a dynamic tree's 17 rows or a block's 8 would set it for every race: their
    # intercepts are fitted at the static families' slope)
    excess = row_slope({family: xy for family, xy in points.items() if family in SLOPE_FAMILIES})
    out = {family: statistics.median(y - excess * x for x, y in xy) for family, xy in points.items()}
    return StepCosts(out, draft, excess, statistics.median(prefills) / ar_step / len(ids))


def row_slope(points: dict[str, list[tuple[float, float]]], most: float = 3.0) -> float:
    """The slope common to every family's (x, y) points, each family about its own means (a fixed-effects fit),
    clipped to [0, most]; 0 where the rows never vary."""
    num = den = 0.0
    for xy in points.values():
        mx, my = statistics.fmean(x for x, _ in xy), statistics.fmean(y for _, y in xy)
        num += sum((x - mx) * (y - my) for x, y in xy)
        den += sum((x - mx) ** 2 for x, _ in xy)
    return min(max(num / den, 0.0), most) if den > 1e-12 else 0.0
