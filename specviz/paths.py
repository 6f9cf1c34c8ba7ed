"""Where things live: the repository root and every folder the product reads, defined once."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ASSETS = REPO / "assets"
DRAFTERS = ASSETS / "drafters"          # the shipped drafters, one folder each: <target>-<method>
DISTILL = ASSETS / "distill"            # self-distillation data: the target's own answers
PROFILES = ASSETS / "profiles"          # measured profiles and recorded app examples the product and tests read
SHARED = REPO.parent / "shared" / "data"  # the team's shared data, beside the checkout (not shipped)
SPEC_BENCH = SHARED / "spec_bench" / "question.jsonl"
TRAIN_PROMPTS = SHARED / "prompts" / "train_prompts.jsonl.gz"


def shipped_drafter(target: str, method: str) -> Path:
    """The folder of the drafter specviz ships for `target` and trained method `method` (it may not exist)."""
    return DRAFTERS / f"{target}-{method}"


def user_cache() -> Path:
    """What this machine keeps between starts (the calibration, GGUFs converted once): SPECVIZ_CACHE_DIR, else
    $XDG_CACHE_HOME/specviz, else ~/.cache/specviz."""
    given = os.environ.get("SPECVIZ_CACHE_DIR", "").strip()
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specviz"
