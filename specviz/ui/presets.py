"""The race form's named presets, defined once: each fills the decode settings from this machine's measured choices
(hardware.Pair: the default race, each method's fastest γ and branches) and DecodeConfig's defaults. No Gradio here:
ui/race.py turns a preset's settings into the form's values; every field stays editable after a preset fills it."""
from __future__ import annotations

from typing import Callable

from specviz import hardware
from specviz.config import DecodeConfig

DEFAULTS = DecodeConfig()
SAMPLING_TEMPERATURE = 0.7  # the sampled preset: exact speculative sampling at a common chat temperature
BEST = "This machine's best"
CUSTOM = "Custom"  # what the selector shows once a field it fills is edited by hand: no preset's settings

# the settings a preset names: the race form's fields, less the prompt, the seed and the length (the reader's own)
FIELDS = ("method", "draft", "gamma", "lookup", "retrieve", "tree", "tree_nodes", "temperature", "top_p")


def race(pair: hardware.Pair, method: str, branches: bool = True, temperature: float = DEFAULTS.temperature) -> dict:
    """One race's settings: `method` at its fastest γ measured here, with the prompt lookup and datastore branches
    measured fastest on its tree and its tree's shape there (none, and its stored tree, when `branches` is False),
    DecodeConfig's sampling defaults."""
    tree, nodes = pair.tree_for(method) if branches else (DEFAULTS.tree, DEFAULTS.tree_nodes)
    return {"method": method, "draft": pair.draft, "gamma": pair.gamma_for(method),
            "lookup": pair.lookup_for(method) if branches else 0,
            "retrieve": pair.retrieve_for(method) if branches else 0,
            "tree": tree, "tree_nodes": nodes,
            "temperature": temperature, "top_p": DEFAULTS.top_p}


# name -> (what it shows, its settings on a machine's pair)
PRESETS: dict[str, tuple[str, Callable[[hardware.Pair], dict]]] = {
    BEST: ("the race this machine measured fastest", lambda pair: race(pair, pair.method)),
    "EAGLE tree": ("EAGLE's trained drafter alone: its tree, no lookup or datastore branch",
                   lambda pair: race(pair, "eagle", branches=False)),
    "Prompt lookup": ("copies of earlier text: no model drafts", lambda pair: race(pair, "pld")),
    "Draft model": ("a separate draft model guesses", lambda pair: race(pair, "vanilla")),
    f"Sampling at {SAMPLING_TEMPERATURE}": (
        "this machine's best race, sampled: the texts differ by chance, the distribution does not",
        lambda pair: race(pair, pair.method, temperature=SAMPLING_TEMPERATURE)),
}
NAMES = tuple(PRESETS)


def settings(name: str, pair: hardware.Pair) -> dict:
    """A preset's settings (FIELDS) on `pair`; a one-line error naming the value and the presets for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not a preset: use one of {', '.join(NAMES)}")
    return PRESETS[name][1](pair)


def info() -> str:
    """The preset selector's info line: what each one shows."""
    return " · ".join(f"{name}: {what}" for name, (what, _) in PRESETS.items())
