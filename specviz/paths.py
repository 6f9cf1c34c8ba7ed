"""Where things live: the repository root and every folder the product reads, defined once."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ASSETS = REPO / "assets"
DRAFTERS = ASSETS / "drafters"          # the shipped drafters, one folder each: <target>-<method>
DISTILL = ASSETS / "distill"            # self-distillation data: the target's own answers
PROFILES = ASSETS / "profiles"          # measured profiles and recorded app examples the product and tests read
SHARED = REPO.parent / "shared" / "data"  # the team's shared data, beside the checkout (not shipped)
SPEC_BENCH = SHARED / "spec_bench" / "question.jsonl"
TRAIN_PROMPTS = SHARED / "prompts" / "train_prompts.jsonl.gz"
