"""A trained drafter's kind, its config (config.json) and the error for an unusable drafter."""
from __future__ import annotations

from dataclasses import dataclass, field

from specviz import methods
from specviz.models.loader import ModelError

KINDS = methods.names(lambda s: s.trained)  # a drafter's kind is the name of the method it drafts for


class DrafterError(ModelError):
    """A drafter folder or checkpoint that cannot be used; the message is one line."""


@dataclass
class DrafterConfig:
    kind: str                      # "eagle" | "medusa" | "layerskip" | "draft"
    target: str                    # the target spec it was trained for
    hidden_size: int
    vocab_size: int                # the target's vocabulary
    draft_vocab: int = 0           # N of the compressed head; 0 = the full vocabulary
    # eagle
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    intermediate_size: int = 0
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    input_norm: bool = True        # EAGLE-1 checkpoints have no input norm on their one layer
    fc_bias: bool = True
    feature_layers: list = field(default_factory=list)  # EAGLE-3: the target hidden states it fuses (indices into
                                   # transformers' hidden_states: 0 = embeddings, i = after i layers); [] = EAGLE-1
    own_lm_head: bool = False      # EAGLE-3 checkpoints carry their own LM head over the draft vocabulary
    # medusa
    medusa_heads: int = 0
    own_lm_heads: bool = False     # Medusa-1 checkpoints carry one LM head per head
    tree: list = field(default_factory=list)  # medusa: the candidate tree (choices), chosen from measured accuracies
    # layerskip
    exit_layer: int = 0            # draft from the hidden state after this many target layers
    # draft
    draft_layers: list = field(default_factory=list)  # the target layers its own layers started from
    training: dict = field(default_factory=dict)  # data, steps, wall time, hardware, measured figures

    @classmethod
    def for_target(cls, kind: str, target_name: str, model_config, draft_vocab: int = 0, **extra) -> "DrafterConfig":
        c = model_config
        rope = getattr(c, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") or getattr(c, "rope_theta", None) or 10000.0
        return cls(kind=kind, target=target_name, hidden_size=c.hidden_size, vocab_size=c.vocab_size,
                   draft_vocab=draft_vocab, num_attention_heads=c.num_attention_heads,
                   num_key_value_heads=getattr(c, "num_key_value_heads", c.num_attention_heads),
                   intermediate_size=c.intermediate_size, rope_theta=float(theta),
                   rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-5)), **extra)
