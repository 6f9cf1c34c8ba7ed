"""The one way a drafter reads the target's features (EAGLE's and Medusa's drafters, in a chain or a tree).

The "feature" is what the target's LM head reads: its final-norm hidden state at each position (EAGLE-1, Medusa), or
EAGLE-3's hidden states after a low, a middle and a high layer side by side. A drafter that drafts from them keeps
per-run state implementing `FeatureReader`; both loops (speculative.py's chain, tree.py's tree) serve it alike:
every target forward also returns the features of the positions it fed, the loop hands those of the positions the
cache keeps to `observe`, and `rollback` forgets the rest with the rejected drafts. A drafter that reads none (a
draft model, prompt lookup, LayerSkip) does not implement it.
"""
from __future__ import annotations

from typing import Protocol, Union, runtime_checkable

import torch

from specviz.drafters.trained import Drafter

# What a drafter reads from each target forward (core.cache.CachedLM.logits' `features`): True for the final-norm
# hidden state, or the indices of the hidden states EAGLE-3 fuses.
Features = Union[bool, tuple[int, ...]]


@runtime_checkable
class FeatureReader(Protocol):
    features: Features  # what it reads from each target forward

    def observe(self, hidden: torch.Tensor) -> None:
        """The target's features (n, f) of the positions its cache now holds beyond the previous ones."""
        ...

    def rollback(self, n_valid: int) -> None:
        """Forget everything about positions from n_valid on."""
        ...


class FeatureHistory:
    """A FeatureReader that keeps the features of every position the target fed (a chain drafter's session over a
    trained drafter: EAGLE's, Medusa's heads), rolled back with the rejected drafts."""

    def __init__(self, drafter: Drafter, vocab_size: int, eos_ids: frozenset[int]):
        self.d, self.vocab_size, self.eos_ids = drafter, vocab_size, eos_ids
        self.features: Features = drafter.features
        # the target's features of positions 0..n-1 are the first n rows of a buffer grown by doubling (a step
        # appends a few rows: no copy of the whole history each step)
        self._rows = torch.empty(0, drafter.feature_size)
        self._n = 0

    @property
    def feats(self) -> torch.Tensor:
        """(n, f) the target's features of positions 0..n-1."""
        return self._rows[:self._n]

    def observe(self, hidden: torch.Tensor) -> None:
        end = self._n + len(hidden)
        if end > len(self._rows) or (self._rows.dtype, self._rows.device) != (hidden.dtype, hidden.device):
            grown = hidden.new_empty(max(end, 2 * len(self._rows), 64), hidden.shape[1])
            grown[:self._n] = self._rows[:self._n]
            self._rows = grown
        self._rows[self._n:end] = hidden
        self._n = end

    def rollback(self, n_valid: int) -> None:
        self._n = min(self._n, max(0, n_valid))
