"""The what-if clock: the same drafts, re-timed on other hardware.

A race records, per target forward, how many rows it verified, how many tokens it kept and what drafting cost
(events.StepEvent). Its speed over AR anywhere follows from two properties of the hardware: T(k)/T(1), what verifying
k rows costs against one step, and the drafter's cost c against one step. So

    speedup = tokens kept / Σ over steps (T(rows)/T(1) + draft forwards × c + b)

where b is the step's bookkeeping (the verdicts, grafting, the cache), measured on this machine in AR steps. The
clocks: this machine's measured verify profile (its row is the measured speedup of the decode steps), a profile measured
elsewhere (`python -m specviz profile --json FILE`, or `make gpu-check`), and the roofline bound of named devices
from their spec sheets (assets/devices.json): T(k) = max(weights / bandwidth, k × 2 × multiply-adds / peak), with the
drafter's c = its bytes / the target's bytes. A roofline row is a bound, not a measurement: small models on GPUs are
bound by kernel launches first, and real decoding reaches a fraction of either roof.

Torch-free: events, profiles and numbers in, rows out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from specviz.metrics import CostProfile, median_overhead
from specviz.paths import ASSETS

DEVICES = ASSETS / "devices.json"
FREE = 1.1        # "verification is free" up to the k where T(k)/T(1) stays within 10% of one step
K_MAX = 4096


class WhatIfError(ValueError):
    """A profile file or device name the what-if clock cannot use; its message is one line naming it."""


@dataclass(frozen=True)
class Step:
    rows: int               # target rows verified (1: a plain step)
    tokens: int             # kept
    draft_forwards: int
    draft_s: float
    seconds: float          # the step's engine seconds (drafting and verification)


def steps_of(events: Iterable) -> list[Step]:
    """The decode steps of a run's StepEvents (the first, the prompt's prefill, is not a decode step)."""
    events = list(events)
    return [Step(1 + len(e.drafts), len(e.emitted), e.draft_forwards, e.draft_s, e.seconds) for e in events[1:]]


@dataclass(frozen=True)
class Target:
    """What the roofline needs of the target and the drafter."""
    weight_bytes: int        # read once a forward
    macs_per_row: float      # multiply-adds one row costs (about the parameter count)
    draft_bytes: int = 0     # read by one drafter forward (0: a drafter without weights, prompt lookup)


@dataclass(frozen=True)
class Clock:
    name: str
    source: str                           # "measured here" | "profile FILE" | "roofline bound (spec sheet)"
    ratio: Callable[[float], float]       # T(k)/T(1)
    c: float                              # one drafter forward / one AR step
    ar_step_s: Optional[float] = None     # seconds of one AR step there (None: unknown)
    bookkeeping: bool = True              # add this run's measured bookkeeping per step

    def crossover(self) -> int:
        """The largest k whose T(k)/T(1) stays within FREE: verification is about free up to it."""
        k = 1
        while k < K_MAX and self.ratio(k + 1) <= FREE:
            k += 1
        return k


@dataclass(frozen=True)
class Device:
    name: str
    kind: str                # "cpu" | "gpu"
    bandwidth_gb_s: float
    peak_tflops: float       # dense 16-bit (bf16, or fp16) flops a second
    source: str

    def step_s(self, k: float, target: Target) -> float:
        """The roofline bound of a forward of k rows: the weight stream or the arithmetic, whichever is longer."""
        return max(target.weight_bytes / (self.bandwidth_gb_s * 1e9), k * 2 * target.macs_per_row /
                   (self.peak_tflops * 1e12))

    def clock(self, target: Target) -> Clock:
        t1 = self.step_s(1, target)
        c = target.draft_bytes / target.weight_bytes  # a drafter forward streams its own weights
        return Clock(self.name, "roofline bound (spec sheet)", lambda k: self.step_s(k, target) / t1, c, t1,
                     bookkeeping=False)


def load_devices(path: Path = DEVICES) -> list[Device]:
    d = json.loads(Path(path).read_text())
    return [Device(x["name"], x["kind"], float(x["bandwidth_gb_s"]), float(x["peak_tflops"]), x["source"])
            for x in d["devices"]]


def profile_clock(path: str | Path, method: str = "", name: str = "") -> Clock:
    """A clock from a verify profile measured elsewhere (`python -m specviz profile --json FILE`): its T(k) and, where
    it has one, the method's drafter cost c per draft forward. One-line WhatIfError for anything else."""
    path = Path(path)
    give = "give a file written by `python -m specviz profile --json FILE`"
    try:
        d = json.loads(path.read_text())
    except OSError as exc:
        raise WhatIfError(f"profile {str(path)!r} cannot be read ({exc.strerror or exc}): {give}") from None
    except json.JSONDecodeError as exc:
        raise WhatIfError(f"profile {str(path)!r} is not a verify profile (not JSON: line {exc.lineno}, column "
                          f"{exc.colno}): {give}") from None
    except ValueError:  # not UTF-8 text
        raise WhatIfError(f"profile {str(path)!r} is not a verify profile (not a text file): {give}") from None
    try:
        if not isinstance(d, dict) or not isinstance(d.get("profile"), dict):
            raise ValueError("it has no \"profile\" object")
        profile = CostProfile(**d["profile"])
        if len(profile.tokens) != len(profile.seconds) or not profile.tokens or min(profile.seconds) <= 0:
            raise ValueError("its tokens and seconds do not match")
    except TypeError:  # fields missing or unknown
        raise WhatIfError(f"profile {str(path)!r} is not a verify profile (its \"profile\" object lacks a verify "
                          f"profile's fields): {give}") from None
    except ValueError as exc:
        raise WhatIfError(f"profile {str(path)!r} is not a verify profile ({exc}): {give}") from None
    costs = {c.get("method"): c.get("c") for c in d.get("costs", []) if isinstance(c, dict)}
    c = costs.get(method)
    where = d.get("hardware") or profile.device
    return Clock(name or f"{where} ({path.name})", f"profile {path.name}" + ("" if c is not None else
                 ", drafter cost from this machine"), profile.ratio, float(c) if c is not None else -1.0,
                 profile.time(1))


@dataclass(frozen=True)
class Row:
    name: str
    source: str
    speedup: float
    ar_tok_s: Optional[float]     # AR's tokens a second there (None: unknown)
    tok_s: Optional[float]        # the race's
    crossover: int
    c: float

    def to_dict(self) -> dict:
        return self.__dict__.copy()


@dataclass(frozen=True)
class Recorded:
    """One race, recorded: its steps and what its AR lane measured on this machine."""
    steps: list[Step]
    ar_step_s: float              # the AR lane's seconds a token
    measured_speedup: float

    @classmethod
    def of(cls, spec_events, ar_events) -> "Recorded":
        return cls.pooled([(spec_events, ar_events)])

    @classmethod
    def pooled(cls, runs: Iterable[tuple]) -> "Recorded":
        """Several prompts' (speculative events, AR events) as one run: every decode step, AR's seconds a token over
        all of them (what `bench --what-if` re-times: each method's steps pooled over the prompts)."""
        steps: list[Step] = []
        ar: list[Step] = []
        for spec_events, ar_events in runs:
            steps += steps_of(spec_events)
            ar += steps_of(ar_events)
        ar_tokens = sum(s.tokens for s in ar) or 1
        ar_step = sum(s.seconds for s in ar) / ar_tokens
        spec_s = sum(s.seconds for s in steps)
        measured = (sum(s.tokens for s in steps) * ar_step / spec_s) if spec_s else 0.0
        return cls(steps, ar_step, measured)

    def draft_c(self) -> float:
        """This machine's drafter cost per draft forward, in AR steps (0 where nothing drafted with a forward)."""
        forwards = sum(s.draft_forwards for s in self.steps)
        return sum(s.draft_s for s in self.steps) / forwards / self.ar_step_s if forwards else 0.0

    def bookkeeping(self, here: Clock) -> float:
        """The median step's seconds outside its forward and its drafting, in AR steps, under this machine's clock."""
        return median_overhead(((s.seconds, s.draft_s, s.rows) for s in self.steps), self.ar_step_s, here.ratio)

    def mean_bookkeeping(self, here: Clock) -> float:
        """The mean step's seconds outside its forward and its drafting, in AR steps, under this machine's clock: with
        it this machine's row sums to the race's own decode seconds, so it gives the measured speedup exactly (with
        the median, which the other clocks add, the app showed x1.20 in this row beside x1.40 measured)."""
        if not self.steps or not self.ar_step_s:
            return 0.0
        return sum((s.seconds - s.draft_s) / self.ar_step_s - here.ratio(s.rows) for s in self.steps) / len(self.steps)

    def retime(self, clock: Clock, b: float = 0.0) -> Row:
        c = clock.c if clock.c >= 0 else self.draft_c()
        cost = sum(clock.ratio(s.rows) + s.draft_forwards * c + (b if clock.bookkeeping else 0.0)
                   for s in self.steps)
        speedup = sum(s.tokens for s in self.steps) / cost if cost else 0.0
        ar_tok_s = 1 / clock.ar_step_s if clock.ar_step_s else None
        return Row(clock.name, clock.source, speedup, ar_tok_s, speedup * ar_tok_s if ar_tok_s else None,
                   clock.crossover(), c)


def here_clock(profile: CostProfile, recorded: Recorded, name: str = "this machine") -> Clock:
    """This machine: its measured verify profile, and its drafter cost from the run itself."""
    return Clock(name, "measured here", profile.ratio, recorded.draft_c(), recorded.ar_step_s)


def table(recorded: Recorded, here: CostProfile, target: Target, devices: Optional[list[Device]] = None,
          profiles: Iterable[Clock] = ()) -> list[Row]:
    """This machine's row first (the decode steps' measured speedup: its bookkeeping the mean that makes its steps
    sum to their measured seconds), then each loaded profile and the roofline bound of each named device (the median
    bookkeeping added where the clock is a measured profile)."""
    mine = here_clock(here, recorded)
    b = recorded.bookkeeping(mine)
    rows = [recorded.retime(mine, recorded.mean_bookkeeping(mine))]
    rows += [recorded.retime(clock, b) for clock in profiles]
    rows += [recorded.retime(d.clock(target)) for d in (load_devices() if devices is None else devices)]
    return rows


def format_table(rows: list[Row], measured: float) -> str:
    f = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
    lines = [f"what-if: the same drafts re-timed, decode steps only (each prompt's prefill left out; measured here "
             f"over them: {measured:.2f}x AR)",
             "| hardware | clock | AR tok/s | race tok/s | speedup | rows free up to | c |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.source} | {f(r.ar_tok_s, '.0f')} | {f(r.tok_s, '.0f')} | {r.speedup:.2f}x | "
                     f"{r.crossover if r.crossover < K_MAX else f'>{K_MAX}'} | {r.c:.3f} |")
    return "\n".join(lines)


def clock_or_device(value: str, devices: Optional[list[Device]] = None) -> Clock | Device:
    """A `--what-if` value: a verify profile file (profile_clock, c left to this machine's) or a device's name
    (device); one-line WhatIfError naming the value and what is accepted."""
    if Path(value).is_file():
        return profile_clock(value)
    try:
        return device(value, devices)
    except WhatIfError:
        devices = load_devices() if devices is None else devices
        raise WhatIfError(f"--what-if {value!r} is neither a profile file nor a known device: give a file written by "
                          "`python -m specviz profile --json FILE` or one of "
                          + ", ".join(repr(d.name) for d in devices) + " (a unique prefix will do)") from None


def device(name: str, devices: Optional[list[Device]] = None) -> Device:
    """A named device of assets/devices.json (case-insensitive, a unique prefix will do); one-line WhatIfError."""
    devices = load_devices() if devices is None else devices
    hits = [d for d in devices if d.name.lower() == name.lower()] or \
        [d for d in devices if d.name.lower().startswith(name.lower())]
    if len(hits) != 1:
        raise WhatIfError(f"device {name!r} is {'ambiguous' if hits else 'unknown'}: use a profile file or one of "
                          + ", ".join(repr(d.name) for d in devices))
    return hits[0]


def _weights(obj, skip: set[int], depth: int = 3, seen: Optional[set[int]] = None) -> dict[int, int]:
    """{data pointer: bytes} of the weights reachable from `obj` (modules' parameters and buffers, and a trained
    drafter's head_weight), a few attributes deep, those in `skip` left out. Duck-typed: no torch here."""
    seen = set() if seen is None else seen
    out: dict[int, int] = {}
    if obj is None or id(obj) in seen or depth < 0 or isinstance(obj, (str, bytes, int, float, bool)):
        return out
    seen.add(id(obj))
    tensors = []
    if callable(getattr(obj, "parameters", None)) and callable(getattr(obj, "buffers", None)):
        tensors = [*obj.parameters(), *obj.buffers()]
    head = getattr(obj, "head_weight", None)
    if head is not None and hasattr(head, "data_ptr"):
        tensors.append(head)
    for t in tensors:
        if t.data_ptr() not in skip:
            out[t.data_ptr()] = t.numel() * t.element_size()
    if not tensors:  # a plain object (an engine, a drafter): look inside
        children = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else \
            getattr(obj, "__dict__", {}).values()
        for child in children:
            if not hasattr(child, "data_ptr"):  # loose tensors are caches and states, not weights
                out.update(_weights(child, skip, depth - 1, seen))
    return out


def target_of(model, engine=None) -> Target:
    """The roofline's Target of a loaded target's nn.Module and, given the race's speculative engine, its drafter's
    weights (the modules the engine reaches that are not the target's own: a draft model, a trained drafter and its
    head rows; none for prompt lookup)."""
    own = {t.data_ptr(): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}
    macs = sum(t.numel() for t in {t.data_ptr(): t for t in model.parameters()}.values())
    draft = _weights(engine, set(own)) if engine is not None else {}
    return Target(sum(own.values()), float(macs), sum(draft.values()))


@dataclass(frozen=True)
class RaceClock:
    """What a finished race keeps for its what-if panel: its recorded steps, this machine's verify profile, the
    roofline's view of the target and drafter, and the method (whose drafter cost a loaded profile may hold)."""
    recorded: Recorded
    here: CostProfile
    target: Target
    method: str

    def rows(self, profiles: Iterable[str | Path] = (), devices: Optional[list[Device]] = None) -> list[Row]:
        """table() with a clock per profile file (a WhatIfError names the first one that is not a profile)."""
        clocks = [profile_clock(p, self.method) for p in profiles]
        return table(self.recorded, self.here, self.target, devices, clocks)
