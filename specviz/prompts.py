"""One reader for prompt files: Spec-Bench-style JSONL (id / question_id, category, prompt or turns or text),
gzipped or not, or plain text with one prompt a line; and the round-robin pick across categories that lets a
small sample still span them. Torch-free; every error is one line naming the file and what is wrong."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from specviz.config import unencodable


class PromptFileError(ValueError):
    """A prompt file that is missing, unreadable or malformed; the message is one line."""


TEXT_FIELDS = ("prompt", "turns", "text")  # where a JSON line's prompt may be, in this order (turns: the first)


def _text(obj, fields: tuple[str, ...]) -> str | None:
    if not isinstance(obj, dict):
        return None
    for field in fields:
        value = obj.get(field)
        value = (value or [None])[0] if field == "turns" and isinstance(value, list) else value
        if isinstance(value, str) and value.strip():
            return value
    return None


def _category(value, where: str) -> str:
    """A JSON line's category as text: a string as it is, a number as its text (5 -> "5"), none -> "-"; anything
    else (a list, an object, true/false) is one line naming the line and the value."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise PromptFileError(f"{where} has category={value!r}: a category is a string (or a number, read as its text)")


def read(path: str | Path, jsonl_only: bool = False, fields: tuple[str, ...] = TEXT_FIELDS) -> list[dict]:
    """The prompts of a file, in file order, as {"id", "category", "prompt"}. A JSON line's id is its `id` or
    `question_id` (else its line number) and its category its `category` as text (a number its text; else "-"); a
    plain-text line's id is its line number. jsonl_only: every line must be a JSON object; fields: the keys that may
    hold a JSON line's text."""
    file = Path(path)
    if not file.is_file():
        raise PromptFileError(f"prompt file {str(path)!r} does not exist")
    opener = gzip.open if file.suffix == ".gz" else open
    rows = []
    try:
        with opener(file, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if jsonl_only or line.lstrip().startswith("{"):
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError:
                        raise PromptFileError(f"{path}:{n} is not valid JSON") from None
                    text = _text(obj, fields)
                    at = None if text is None else unencodable(text)
                    if at is not None:
                        raise PromptFileError(f"{path}:{n} holds a lone surrogate U+{ord(text[at]):04X} (half of a "
                                              "\\u escape pair), which no text encoding holds: fix the line")
                    if text is None:
                        raise PromptFileError(f"{path}:{n} has no {fields[0]!r} text"
                                              + (f" (nor {' or '.join(map(repr, fields[1:]))})" if fields[1:] else ""))
                    rows.append({"id": obj.get("id", obj.get("question_id", n)),
                                 "category": _category(obj.get("category"), f"{path}:{n}"), "prompt": text})
                else:
                    rows.append({"id": n, "category": "-", "prompt": line.strip()})
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise PromptFileError(f"prompt file {str(path)!r} cannot be read: {type(exc).__name__}") from None
    if not rows:
        raise PromptFileError(f"prompt file {str(path)!r} holds no prompts")
    return rows


def pick(rows: list[dict], categories: list[str] | None = None, limit: int | None = None,
         source: str = "the prompt file") -> list[dict]:
    """Keep the given categories, then at most `limit` rows taken round-robin across categories."""
    if categories:
        known = sorted({r["category"] for r in rows})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise PromptFileError(f"categories {unknown} are not in {source}: use some of {', '.join(known)}")
        rows = [r for r in rows if r["category"] in categories]
    if limit is not None:
        if limit < 1:
            raise PromptFileError(f"limit={limit} is out of range: use a positive integer")
        by_cat: dict[str, list[dict]] = {}
        for r in rows:
            by_cat.setdefault(r["category"], []).append(r)
        picked, queues = [], list(by_cat.values())
        while len(picked) < limit and any(queues):
            for q in queues:
                if q and len(picked) < limit:
                    picked.append(q.pop(0))
        rows = picked
    return rows
