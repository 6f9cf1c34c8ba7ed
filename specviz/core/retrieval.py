"""Retrieval drafts (as REST does): continue the context with what most often followed its last few tokens in
a datastore of the target's own answers. No model: an n-gram index over token ids, built once per process.

The embedded target's datastore is its greedy answers to the licensed training prompts (assets/distill/, never
Spec-Bench; attribution in LICENSES/). For the context's longest suffix of MAX_ORDER..MIN_ORDER tokens found in
the datastore, up to CANDIDATES of its occurrences vote: the draft is a small tree (a trie of what followed) of
the continuations most of them share, grown best first, each node held by at least MIN_SHARE of the occurrences
that agree with its parent: a chain where the vote is clear, a fork where it splits; on held-out answers the tree
accepts more per node drafted than a chain (experiments/probes/datastore_tree.py,
experiments/results/datastore_tree.txt).
"""
from __future__ import annotations

import heapq
import itertools
import threading
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

MAX_ORDER = 4      # longest suffix looked up (tokens)
MIN_ORDER = 2      # shortest: one token alone matches too much of everything
CANDIDATES = 256   # occurrences that vote, evenly spaced over all of them (deterministic)
MIN_SHARE = 0.1    # a node needs this share of the votes of the occurrences agreeing with its parent
DATASTORE_FILE = "datastore.npy"  # a drafter trained on your own data keeps its answers beside its weights
MAX_DEPTH = 8      # the deepest node drafted: a large budget goes to forks rather than ever deeper guesses
MAX_KEY = (1 << 64) - 1  # the largest n-gram key (uint64)


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

    def save(self, path: str | Path) -> None:
        """The token stream (answers separated by -1) as an int32 .npy file; load() indexes it again."""
        np.save(Path(path), self.tokens.astype(np.int32), allow_pickle=False)

    @classmethod
    def load(cls, path: str | Path) -> "Datastore":
        """A datastore saved by save() (a drafter's own, `DATASTORE_FILE` in its folder)."""
        stream = np.load(Path(path), allow_pickle=False).astype(np.int64)
        parts = np.split(stream, np.nonzero(stream < 0)[0] + 1)  # each answer with its -1
        return cls(part[part >= 0].tolist() for part in parts if (part >= 0).any())

    def _key(self, suffix: list[int]) -> int:
        key = 0
        for token in reversed(suffix):
            key = (key << self.bits) | int(token)
        return key

    def occurrences(self, tokens: list[int]) -> np.ndarray:
        """Where the longest suffix of `tokens` found here ends (up to CANDIDATES of them, evenly spaced as
        np.linspace spaces them); empty when no suffix of MIN_ORDER tokens or more occurs. Three numpy calls an order
        tried: right after the target's forward each costs tens of microseconds (experiments/LOG.md)."""
        for n in range(min(self.max_order, len(tokens)), MIN_ORDER - 1, -1):
            suffix = tokens[-n:]
            if max(suffix) >= 1 << self.bits or min(suffix) < 0:
                continue  # a token the datastore has never seen
            keys, where = self.tables[n]
            key = self._key(suffix)
            lo, hi = keys.searchsorted(np.array([key, min(key + 1, MAX_KEY)], dtype=np.uint64)).tolist()
            hi = len(keys) if key == MAX_KEY else hi  # keys are integers: the first above key is the first >= key + 1
            if hi > lo:
                count = min(CANDIDATES, hi - lo)
                if count == 1:
                    return where[lo:lo + 1]
                step = (hi - 1 - lo) / (count - 1)  # np.linspace(lo, hi - 1, count)'s float64 steps, truncated
                return where[[int(i * step + lo) for i in range(count - 1)] + [hi - 1]]
        return np.zeros(0, dtype=np.int64)

    def drafts(self, tokens: list[int], nodes: int, depth: int = MAX_DEPTH) -> list[list[int]]:
        """The tree of up to `nodes` tokens (no deeper than `depth`) that most often followed the longest suffix of
        `tokens` found here, as its root-to-leaf chains, the most voted first. The vote runs over Python lists of at
        most CANDIDATES rows (one numpy read)."""
        ends = self.occurrences(tokens) if nodes > 0 else np.zeros(0, dtype=np.int64)
        depth = min(depth, nodes, MAX_DEPTH)
        if not len(ends) or depth <= 0:
            return []
        last = len(self.tokens) - 1
        flat = self.tokens[[min(e + k, last) for e in ends.tolist() for k in range(1, depth + 1)]].tolist()
        follow = [flat[i:i + depth] for i in range(0, len(flat), depth)]  # (c, depth): what followed each end
        order = itertools.count()  # ties: the first pushed first
        frontier = [(-len(follow), next(order), (), list(range(len(follow))))]  # (-votes, tie, path, agreeing rows)
        chosen: list[tuple[int, ...]] = []
        while frontier and len(chosen) < nodes:
            _, _, path, alive = heapq.heappop(frontier)
            if path:
                chosen.append(path)
            if len(path) == depth:
                continue
            at = len(path)
            for token, votes in Counter(t for t in (follow[i][at] for i in alive) if t >= 0).most_common():
                if votes < MIN_SHARE * len(alive):
                    break
                heapq.heappush(frontier, (-votes, next(order), path + (token,),
                                          [i for i in alive if follow[i][at] == token]))
        rank = {p: i for i, p in enumerate(chosen)}
        leaves = [p for p in chosen if not any(len(q) > len(p) and q[:len(p)] == p for q in chosen)]
        leaves.sort(key=lambda p: [rank[p[:k]] for k in range(1, len(p) + 1)])  # the first chosen branches first
        return [list(p) for p in leaves]


_stores: dict[str, Datastore] = {}
_lock = threading.Lock()
Source = Callable[[], Iterable[list[int]]]  # a target's own answers (token ids), read when its datastore is built


def datastores() -> set[str]:
    """The targets whose datastore is built or registered (use) in this process."""
    return set(_stores)


def use(target_name: str, store: Datastore) -> None:
    """Register a datastore for a target (its own answers, e.g. a drafter trained on your domain; tests)."""
    with _lock:
        _stores[target_name] = store


def forget(target_name: str) -> None:
    """Drop a target's datastore (the next datastore_for builds it again, if given its source)."""
    with _lock:
        _stores.pop(target_name, None)


def datastore_for(target_name: str, source: Source | None = None) -> Datastore | None:
    """The datastore of a target's own answers, built once per process from `source` (the caller's: the engines hand
    the embedded target's committed self-distillation answers, engines.tree.ANSWERS); None when there is none."""
    with _lock:
        if target_name not in _stores and source is not None:
            _stores[target_name] = Datastore(source())
        return _stores.get(target_name)
