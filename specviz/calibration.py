"""This machine's calibration (the verify profile T(k), the lanes' step costs), kept per machine in a cache file.

The default race is chosen from a measurement of the machine it runs on (specviz/tuning.py): about half a minute on a
busy 2-core CPU. The measurement is kept in `<cache>/calibration-<key>.json` (cache: SPECVIZ_CALIBRATION_DIR, else
$XDG_CACHE_HOME/specviz, else ~/.cache/specviz), keyed by what moves T(k) and the step costs: the CPU model, the
kernel build (the instruction set chosen, SPECVIZ_KERNEL_ISA, and the kernels' sources), the core and thread counts,
the torch version and the target (name, dtype, attention). A quick read of memory bandwidth (core/roofline.py) must
also agree with the one taken at measuring time within a factor of BANDWIDTH_FACTOR, or the file is measured again.
The race itself is chosen afresh from the kept figures and the shipped race grid at every start (tuning.choose), so a
new grid needs no new measurement.

SPECVIZ_CALIBRATE: unset (or empty) reuses a valid kept calibration and measures otherwise; `1` always measures (and
keeps the result); `0` never measures: a valid kept calibration, else the shipped defaults, saying so. The app and
the CLI (`bench`, `generate`, `check` without γ: hardware.adopt) read the same file.

torch is imported inside the functions: importing this module stays cheap.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from specviz import paths
from specviz.errors import ConfigError

log = logging.getLogger("specviz.calibration")

ENV = "SPECVIZ_CALIBRATE"
DIR_ENV = "SPECVIZ_CALIBRATION_DIR"
MODES = {"": "auto", "0": "never", "1": "always"}
VERSION = 2  # of the file's layout and of what its figures mean; a new one measures again (2: the DFlash lane)
BANDWIDTH_BYTES = 128 << 20  # the quick check: a few sums over 128 MB (about 0.3 s)
BANDWIDTH_REPS = 4
# how far the quick check may read from the kept one: on this project's shared 2-core EPYC the medians of back-to-back
# checks spread 1.7x (4.4 to 7.4 GB/s under load), while another memory system (channels, DDR generation) reads 2x
# and more apart
BANDWIDTH_FACTOR = 2.0

Say = Callable[[str], None]


def mode() -> str:
    """SPECVIZ_CALIBRATE as "auto", "never" or "always"; a ConfigError (one line) for any other value."""
    raw = os.environ.get(ENV, "")
    if raw.strip() not in MODES:
        raise ConfigError(f"{ENV}={raw!r} is not understood: use 0 (never measure: the kept calibration, else the "
                          "shipped defaults), 1 (always measure) or leave it unset (reuse a kept one when valid)")
    return MODES[raw.strip()]


def cache_dir() -> Path:
    """Where calibrations are kept: SPECVIZ_CALIBRATION_DIR, else paths.user_cache() (SPECVIZ_CACHE_DIR,
    $XDG_CACHE_HOME/specviz or ~/.cache/specviz)."""
    given = os.environ.get(DIR_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    return paths.user_cache()


def machine_key(target) -> dict:
    """What the kept figures depend on, for a loaded target on this machine."""
    import torch

    from specviz.models import kernels

    digest = hashlib.sha256()
    for name in (*kernels.SOURCES, *kernels.HEADERS):
        try:
            digest.update((kernels.SOURCE_DIR / name).read_bytes())
        except OSError:
            digest.update(f"missing {name}".encode())
    return {"version": VERSION,
            "cpu": kernels.cpuinfo("model name") or platform.processor() or platform.machine() or "unknown",
            "kernels": kernels.describe() if target.device.type == "cpu" else "",
            "kernel_sources": digest.hexdigest()[:16],
            "cores": os.cpu_count() or 0,
            "threads": torch.get_num_threads(),
            "kernel_threads": kernels.threads(),
            "torch": torch.__version__,
            "device": str(target.device),
            "target": target.name,
            "dtype": str(target.dtype).replace("torch.", ""),
            "attention": str(target.attention)}


def path_for(key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"calibration-{name}.json"


@dataclass(frozen=True)
class Calibration:
    """One machine's measured figures: the verify profile (metrics.CostProfile) and the step costs (tuning.StepCosts),
    with the key they were measured under, the quick bandwidth read then (bytes/s) and when (ISO date)."""
    key: dict
    profile: object
    costs: object
    bandwidth: float
    measured: str

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "bandwidth": self.bandwidth, "measured": self.measured,
                           "profile": self.profile.to_dict(), "costs": asdict(self.costs)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Calibration":
        from specviz.metrics import CostProfile
        from specviz.tuning import StepCosts

        d = json.loads(text)
        costs = d["costs"]
        return cls(d["key"], CostProfile(**d["profile"]),
                   StepCosts({k: float(v) for k, v in costs["lanes"].items()},
                             {k: float(v) for k, v in costs.get("draft", {}).items()}, float(costs["row_excess"]),
                             float(costs.get("prefill", 0.0))),
                   float(d["bandwidth"]), str(d["measured"]))


def quick_bandwidth(device: str = "cpu") -> float:
    from specviz.core.roofline import read_bandwidth

    return read_bandwidth(device, BANDWIDTH_BYTES, BANDWIDTH_REPS)


def load(key: dict, bandwidth: Optional[Callable[[], float]] = None) -> tuple[Optional[Calibration], str]:
    """The kept calibration for `key` when valid (the quick bandwidth read, `bandwidth()`, agreeing with the kept
    one), else None; and one line on why it is or is not used."""
    path = path_for(key)
    if not path.is_file():
        return None, f"no kept calibration for this machine in {path.parent}"
    try:
        kept = Calibration.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"the kept calibration {path.name} is unreadable ({type(exc).__name__})"
    if kept.key != key:
        changed = sorted(k for k in set(key) | set(kept.key) if key.get(k) != kept.key.get(k))
        return None, f"the kept calibration {path.name} was measured under another {', '.join(changed)}"
    now = (bandwidth or quick_bandwidth)()
    if not 1 / BANDWIDTH_FACTOR <= now / kept.bandwidth <= BANDWIDTH_FACTOR:
        return None, (f"memory now reads at {now / 1e9:.1f} GB/s against {kept.bandwidth / 1e9:.1f} GB/s when "
                      f"{path.name} was measured: not the same machine")
    return kept, f"this machine's calibration of {kept.measured} ({path})"


def store(cal: Calibration) -> str:
    """Keep a calibration (atomically); one line on where, or on why it could not be kept (never raises)."""
    path = path_for(cal.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(cal.to_json())
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not keep this machine's calibration in %s (%s)", path, exc.strerror or exc)
        return f"not kept: {path.parent} is not writable"
    return f"kept in {path}"


@dataclass(frozen=True)
class Outcome:
    """How this process's default race was settled: the choice (tuning.Choice; None: the shipped defaults stay),
    where its figures came from ("measured", "kept", "shipped" where SPECVIZ_CALIBRATE=0 found none kept, "none" where
    the target ships no race grid) and one line saying so."""
    choice: object
    source: str
    line: str


def measure(target, say: Say) -> Calibration:
    """Measure this machine for a loaded target: T(k) and the step costs, `say` told the progress (between rounds,
    so a `say` that waits pauses the measurement)."""
    from specviz import tuning
    from specviz.core.profile import APP_REPS, APP_SIZES, keep, verify_profile

    say("measuring this machine: memory bandwidth…")
    key, bw = machine_key(target), quick_bandwidth(target.device.type)
    say(f"measuring this machine: what checking k guesses at once costs, 0 of {len(APP_SIZES)}…")
    # measured here, not through profile_of: `say` may wait for a race to end, and a race reads profile_of
    prof = verify_profile(target, APP_SIZES, reps=APP_REPS,
                          tick=lambda n: say(f"measuring this machine: what checking k guesses at once costs, {n} of "
                                             f"{len(APP_SIZES)}…"))
    keep(target, prof)
    costs = tuning.measure_costs(target, prof, tick=lambda n, of: say(f"measuring this machine: each drafter's step, "
                                                                       f"{n} of {of}…"))
    return Calibration(key, prof, costs, bw, time.strftime("%Y-%m-%d %H:%M"))


_outcomes: dict[int, Outcome] = {}
_lock = threading.Lock()


def calibrate(target, say: Optional[Say] = None) -> Outcome:
    """This process's default race for a loaded target, settled once (SPECVIZ_CALIBRATE: module docstring): from the
    kept calibration when valid, else measured and kept, else (SPECVIZ_CALIBRATE=0) the shipped defaults. `say` is
    told each step ("measuring this machine: what checking k guesses at once costs, 3 of 9…"). Raises ConfigError
    for a bad SPECVIZ_CALIBRATE."""
    from specviz import tuning
    from specviz.core import profile

    how = mode()
    say = say or (lambda line: None)
    with _lock:
        if id(target.model) in _outcomes:
            return _outcomes[id(target.model)]
        grid = tuning.load_grid(target.name)
        if grid is None:
            outcome = Outcome(None, "none", f"{target.name} ships no race grid: its defaults stay")
        else:
            kept, why = None, "SPECVIZ_CALIBRATE=1"
            if how != "always":
                say("checking this machine's kept calibration…")
                kept, why = load(machine_key(target), lambda: quick_bandwidth(target.device.type))
            if kept is not None:
                profile.keep(target, kept.profile)
                choice = tuning.choose(grid, kept.profile, kept.costs)
                outcome = Outcome(choice, "kept", f"{choice.line()}; from {why}")
            elif how == "never":
                outcome = Outcome(None, "shipped", f"SPECVIZ_CALIBRATE=0 and {why}: the shipped defaults race")
            else:
                cal = measure(target, say)
                choice = tuning.choose(grid, cal.profile, cal.costs)
                outcome = Outcome(choice, "measured", f"{choice.line()}; measured now ({why}), {store(cal)}")
        _outcomes[id(target.model)] = outcome
        return outcome


def outcome(target) -> Optional[Outcome]:
    """How calibrate() settled this process's race for a loaded target; None before it has."""
    with _lock:
        return _outcomes.get(id(target.model))


def forget() -> None:
    """Drop this process's settled outcomes (tests)."""
    with _lock:
        _outcomes.clear()
