"""A trained drafter's kind, its config (config.json) and the error for an unusable drafter."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from specviz import methods
from specviz.models.loader import ModelError

KINDS = methods.names(lambda s: s.trained)  # a drafter's kind is the name of the method it drafts for


class DrafterError(ModelError):
    """A drafter folder or checkpoint that cannot be used; the message is one line."""


def check_kind(kind: str, method: str, name: str) -> None:
    """A drafter runs only as the method of its kind (a Medusa folder never races labelled eagle): one line naming
    the folder otherwise."""
    if kind != method:
        raise DrafterError(f"drafter {name!r} is a {kind} drafter, not {method}: pick method {kind}")


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
    # dflash (also feature_layers: the target hidden states its fc fuses into the context)
    block_size: int = 0            # tokens a block: the verified token then block_size - 1 masks, drafted at once
    mask_token_id: int = 0         # the target's token whose embedding fills the masked slots
    num_hidden_layers: int = 0     # its own decoder layers
    training: dict = field(default_factory=dict)  # data, steps, wall time, hardware, measured figures

    @classmethod
    def from_dict(cls, raw: dict, where: str) -> "DrafterConfig":
        """A config.json's fields (unknown keys ignored), each checked for its type and range before anything is
        built from it; a one-line DrafterError naming `where`, the field and what it takes otherwise."""
        missing = [f.name for f in fields(cls) if f.name in REQUIRED and f.name not in raw]
        if missing:
            raise DrafterError(f"{where}: config.json lacks {', '.join(missing)}: train the drafter again with "
                               "python -m specviz train")
        values = {}
        for f in fields(cls):
            if f.name in raw:
                values[f.name] = _field(f.name, raw[f.name], where)
        cfg = cls(**values)
        if cfg.kind not in KINDS:
            raise DrafterError(f"{where}: kind={cfg.kind!r} is unknown: use one of {', '.join(KINDS)}")
        heads = cfg.num_attention_heads
        if heads and (cfg.hidden_size % heads or (cfg.num_key_value_heads and heads % cfg.num_key_value_heads)):
            raise DrafterError(f"{where}: hidden_size={cfg.hidden_size}, num_attention_heads={heads} and "
                               f"num_key_value_heads={cfg.num_key_value_heads} do not divide: the heads must split "
                               "the hidden size and share the key-value heads evenly")
        return cfg

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


REQUIRED = ("kind", "target", "hidden_size", "vocab_size")
# what each field takes: (type, least value) for numbers, (type, None) otherwise; bool is not an int here
_TYPES: dict[str, tuple[type, object]] = {
    "kind": (str, None), "target": (str, None), "hidden_size": (int, 1), "vocab_size": (int, 1),
    "draft_vocab": (int, 0), "num_attention_heads": (int, 0), "num_key_value_heads": (int, 0),
    "intermediate_size": (int, 0), "rope_theta": (float, 0.0), "rms_norm_eps": (float, 0.0),
    "input_norm": (bool, None), "fc_bias": (bool, None), "feature_layers": (list, None), "own_lm_head": (bool, None),
    "medusa_heads": (int, 0), "own_lm_heads": (bool, None), "tree": (list, None), "exit_layer": (int, 0),
    "draft_layers": (list, None), "training": (dict, None)}
_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
          dict: "an object"}


def _field(name: str, value, where: str):
    """One config.json field checked against _TYPES (an int is a float too; lists of layers hold integers)."""
    if name not in _TYPES:  # a field without a declared type (a newer kind's): taken as it is
        return value
    kind, least = _TYPES[name]
    ok = (isinstance(value, kind) and not (kind is int and isinstance(value, bool))
          or kind is float and isinstance(value, int) and not isinstance(value, bool))
    if ok and name in ("feature_layers", "draft_layers"):
        ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    if ok and name == "tree":
        ok = all(isinstance(p, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in p)
                 for p in value)
    if not ok:
        what = {"feature_layers": "a list of layer indices", "draft_layers": "a list of layer indices",
                "tree": "a list of paths (lists of integers)"}.get(name, _WORDS[kind])
        raise DrafterError(f"{where}: config.json's {name}={value!r:.60} is not {what}")
    if least is not None and value < least:
        raise DrafterError(f"{where}: config.json's {name}={value!r} is out of range: use {least} or more")
    return float(value) if kind is float else value


def not_a_drafter_folder(folder: str | Path, method: str = "") -> str:
    """Why `folder` (no config.json in it) is not a drafter folder, in one line: it does not exist, it is a file, or
    it is train's --out folder, whose drafter/ is the drafter."""
    folder, train = Path(folder), f"python -m specviz train {method}".rstrip()
    if folder.is_file():
        return f"drafter folder {str(folder)!r} is a file: give the folder that holds it ({str(folder.parent)!r})"
    if not folder.exists():
        return (f"drafter folder {str(folder)!r} does not exist: give a folder written by {train}, or omit it for "
                "the shipped one")
    if (folder / "drafter" / "config.json").is_file():
        return (f"drafter folder {str(folder)!r} has no config.json, its drafter/ has: give {str(folder / 'drafter')!r}"
                " (train --out DIR writes the drafter to DIR/drafter)")
    return f"drafter folder {str(folder)!r} has no config.json: train one with {train}"


def read_config(folder: str | Path) -> dict:
    """A drafter folder's config.json as a dict, or a one-line DrafterError: no such folder, no config.json, a file
    that is not JSON or not a JSON object."""
    folder = Path(folder)
    file = folder / "config.json"
    if not file.is_file():
        raise DrafterError(not_a_drafter_folder(folder))
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DrafterError(f"{file} cannot be read ({type(exc).__name__})") from None
    except json.JSONDecodeError as exc:
        raise DrafterError(f"{file} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}): "
                           "write it again with python -m specviz train") from None
    if not isinstance(raw, dict):
        raise DrafterError(f"{file} holds a JSON {type(raw).__name__}, not an object of settings")
    return raw
