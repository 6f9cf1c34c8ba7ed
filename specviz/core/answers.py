"""The committed self-distillation answers, read: the target's own greedy answers, kept as token ids.

Two forms hold them. An example file is JSONL (gzipped when it ends in .gz), one {"i", "prompt_ids", "answer_ids"}
a line (ORIGINAL: the first file, the project's prompts). A chunk folder is what `distill` writes (PROMPTS_OUT: the
shared prompt set): chunk-0000c.jsonl.gz files of such rows, and a manifest.json with each chunk's sha256, counts and
timing. The datastore (engines.tree.ANSWERS), training (specviz.train) and the CLI read them through this module;
writing them is specviz/train/distill.py's.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from specviz.paths import DISTILL

PROMPTS_OUT = DISTILL / "prompts"
ORIGINAL = DISTILL / "smollm2-135m.jsonl.gz"  # the first self-distillation file (the project's prompts)
MANIFEST = "manifest.json"


class DistillError(ValueError):
    """A prompt file or output folder that cannot be used; the message is one line."""


def is_example_file(path: str | Path) -> bool:
    """Whether a data file holds generated examples (JSONL, maybe gzipped, of prompt_ids and answer_ids)
    rather than prompts for the target to answer."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        row = json.loads(first) if first.lstrip().startswith("{") else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(row, dict) and "prompt_ids" in row and "answer_ids" in row


def read_examples(path: str | Path) -> list[dict]:
    """Examples from a .jsonl or .jsonl.gz file of {"i", "prompt_ids", "answer_ids"}; where a row has no "i" (a
    chunk file of `distill` read on its own), its line number in the file (what split() keys on). DistillError, one
    line naming the file (and line) and the format, for a file that cannot be read or a line that is not such a row."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    expected = ("give self-distillation ids (JSONL(.gz), one {\"prompt_ids\": [...], \"answer_ids\": [...]} a line, "
                "as `distill` and `train` write them) or a folder written by `distill`")
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    row = None
                if not (isinstance(row, dict) and "prompt_ids" in row and "answer_ids" in row):
                    raise DistillError(f"{path}:{n} is not a JSON object of prompt_ids and answer_ids: {expected}")
                rows.append(row)
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise DistillError(f"{path} cannot be read ({type(exc).__name__}): {expected}") from None
    return [row if "i" in row else {"i": n, **row} for n, row in enumerate(rows)]


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(out_dir: str | Path) -> dict | None:
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise DistillError(f"{path} is not valid JSON: fix or remove it") from None


def verified_chunks(out_dir: str | Path, manifest: dict | None) -> dict[int, dict]:
    """The manifest's chunk entries whose file exists with the recorded sha256, by chunk index."""
    good = {}
    for entry in (manifest or {}).get("chunks", []):
        path = Path(out_dir) / entry["file"]
        if path.is_file() and sha256_file(path) == entry["sha256"]:
            good[int(entry["index"])] = entry
    return good


def read_chunks(out_dir: str | Path = PROMPTS_OUT, verify: bool = True) -> list[dict]:
    """The examples of every finished chunk in order, each with "i", its line in the prompt file (what
    split() keys on). verify: only chunks whose sha256 matches the manifest."""
    manifest = read_manifest(out_dir)
    if manifest is None:
        return []
    size = int(manifest["chunk_size"])
    entries = verified_chunks(out_dir, manifest) if verify else {int(e["index"]): e for e in manifest["chunks"]}
    examples = []
    for index in sorted(entries):
        for n, row in enumerate(read_examples(Path(out_dir) / entries[index]["file"])):
            examples.append({**row, "i": index * size + n})
    return examples


def committed_examples() -> list[dict]:
    """Every committed self-distillation example of the embedded target: the original file, then the chunks of the
    shared prompt set (what `make drafters` trains on and the datastore indexes)."""
    return read_examples(ORIGINAL) + read_chunks(PROMPTS_OUT)
