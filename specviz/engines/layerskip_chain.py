"""LayerSkip as a chain drafter for the check (`specviz check --method layerskip`, the app's Check tab): the target's
own first L layers and the trained exit adapter draft, as in LayerSkip's engine (engines/layerskip.py), but over a
KV cache of their own, so any chain loop can verify the drafts with the full target on its cache. The engine shares
one cache between drafting and verification (the verifier skips the first L layers); here those layers run twice,
so the check's timing of LayerSkip is pessimistic by them, while its exactness and acceptance figures are the
engine's (the same drafts from the same layers and adapter).
"""
from __future__ import annotations

from specviz.engines.layerskip import LayerSkipSession, SplitLM


class LayerSkipChainDrafter:
    """A trained drafter of kind "layerskip" (drafters.modules.ExitAdapter) as a chain drafter."""

    def __init__(self, drafter, name: str):
        self.drafter, self.name = drafter, name

    def session(self, vocab_size: int, eos_ids: frozenset[int]) -> "LayerSkipChainSession":
        return LayerSkipChainSession(self.drafter, vocab_size, eos_ids)


class LayerSkipChainSession(LayerSkipSession):
    """LayerSkip's own drafting loop (engines/layerskip.py) over a cache of its own first layers."""
    own_cache = True

    def __init__(self, drafter, vocab_size: int, eos_ids: frozenset[int]):
        super().__init__(SplitLM(drafter.target_model, drafter.head_weight.device, drafter.cfg.exit_layer), drafter,
                         eos_ids)
        self.vocab_size = vocab_size

    @property
    def empty_vocab(self) -> int:
        return self.vocab_size

    def rollback(self, n_valid: int) -> None:
        self.lm.rollback(n_valid)
