"""Retrieval drafts (as REST does): continue the context with what most often followed its last few tokens in
a datastore of the target's own answers. No model: an n-gram index over token ids, built once per process.

The embedded target's datastore is its greedy answers to the licensed training prompts (assets/distill/, never
Spec-Bench; attribution in LICENSES/). For the context's longest suffix of MAX_ORDER..MIN_ORDER tokens found in
the datastore, up to CANDIDATES of its occurrences vote token by token: the continuation follows the most
common next token among the occurrences still agreeing, while that token holds at least MIN_SHARE of them.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Iterable

import numpy as np

from specviz.config import DEFAULT_TARGET

MAX_ORDER = 4      # longest suffix looked up (tokens)
MIN_ORDER = 2      # shortest: one token alone matches too much of everything
CANDIDATES = 256   # occurrences that vote, evenly spaced over all of them (deterministic)
MIN_SHARE = 0.25   # stop the continuation where its next token has less than this share of the votes


class Datastore:
    """An index of token sequences: for every order n, the n-gram keys of every position (sorted) and where
    each occurs. A key packs n token ids of `bits` bits each into one uint64 (n * bits <= 64)."""

    def __init__(self, sequences: Iterable[list[int]]):
        parts = [np.asarray(list(s) + [-1], dtype=np.int64) for s in sequences]  # -1 ends each sequence
        self.tokens = np.concatenate(parts) if parts else np.full(1, -1, dtype=np.int64)
        self.bits = max(1, int(self.tokens.max(initial=1)).bit_length())
        self.max_order = min(MAX_ORDER, 64 // self.bits)
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        n_tok = len(self.tokens)
        for n in range(MIN_ORDER, self.max_order + 1):
            keys = np.zeros(n_tok, dtype=np.uint64)
            valid = np.ones(n_tok, dtype=bool)
            for back in range(n):  # key of position i: tokens i, i-1, ..., i-n+1 (most recent in the high bits)
                shifted = np.full(n_tok, -1, dtype=np.int64)
                shifted[back:] = self.tokens[:n_tok - back]
                valid &= shifted >= 0
                keys = (keys << np.uint64(self.bits)) | np.where(shifted >= 0, shifted, 0).astype(np.uint64)
            where = np.nonzero(valid)[0]
            order = np.argsort(keys[where], kind="stable")
            self.tables[n] = (keys[where][order], where[order])

    def __len__(self) -> int:
        return int((self.tokens >= 0).sum())

    def _key(self, suffix: list[int]) -> int:
        key = 0
        for token in reversed(suffix):
            key = (key << self.bits) | int(token)
        return key

    def continuation(self, tokens: list[int], length: int) -> list[int]:
        """Up to `length` tokens that most often followed the longest suffix of `tokens` found here."""
        if length <= 0:
            return []
        for n in range(min(self.max_order, len(tokens)), MIN_ORDER - 1, -1):
            suffix = tokens[-n:]
            if max(suffix) >= 1 << self.bits or min(suffix) < 0:
                continue  # a token the datastore has never seen
            keys, where = self.tables[n]
            key = self._key(suffix)
            lo, hi = np.searchsorted(keys, np.uint64(key), "left"), np.searchsorted(keys, np.uint64(key), "right")
            if hi > lo:
                return self._vote(where[np.linspace(lo, hi - 1, min(CANDIDATES, hi - lo)).astype(np.int64)], length)
        return []

    def _vote(self, ends: np.ndarray, length: int) -> list[int]:
        follow = self.tokens[np.minimum(ends[:, None] + np.arange(1, length + 1), len(self.tokens) - 1)]  # (c, L)
        alive = np.ones(len(ends), dtype=bool)  # occurrences agreeing with the continuation so far
        out: list[int] = []
        for depth in range(length):
            column = follow[alive, depth]
            column = column[column >= 0]
            if not len(column):
                break
            token, votes = Counter(column.tolist()).most_common(1)[0]
            if votes < MIN_SHARE * alive.sum():
                break
            out.append(int(token))
            alive &= follow[:, depth] == token
        return out


_stores: dict[str, Datastore] = {}
_lock = threading.Lock()


def _distilled_answers() -> Iterable[list[int]]:
    from specviz import distill

    return (row["answer_ids"] for row in distill.committed_examples())


SOURCES = {DEFAULT_TARGET: _distilled_answers}  # target -> its answers (the committed self-distillation ids)


def datastores() -> set[str]:
    """The targets that have a datastore (built or buildable)."""
    return set(SOURCES) | set(_stores)


def use(target_name: str, store: Datastore) -> None:
    """Register a datastore for a target (its own answers, e.g. a drafter trained on your domain; tests)."""
    with _lock:
        _stores[target_name] = store


def forget(target_name: str) -> None:
    """Drop a target's datastore (the next datastore_for builds it again, if it has a source)."""
    with _lock:
        _stores.pop(target_name, None)


def datastore_for(target_name: str) -> Datastore | None:
    """The datastore of a target's own answers, built once per process; None when there is none for it."""
    with _lock:
        if target_name not in _stores and target_name in SOURCES:
            _stores[target_name] = Datastore(SOURCES[target_name]())
        return _stores.get(target_name)
