"""Controls follow the method: which of a form's fields apply to the chosen method, read from the registry
(specviz/methods.py), and one line saying why the others are hidden. No Gradio here: the tabs (ui/race.py,
ui/step.py) turn a `Fields` into component updates."""
from __future__ import annotations

import html
from dataclasses import dataclass

from specviz import methods


@dataclass(frozen=True)
class Fields:
    """The fields a method takes: shown (True) or hidden, and why the hidden ones are."""
    draft: bool                    # the draft model field: only for a method that drafts with a draft model
    gamma: bool                    # γ: where it applies (every speculative method has one today)
    lookup: bool                   # prompt lookup's branch: only on a tree that takes it
    retrieve: bool                 # the datastore's branch: likewise
    gamma_info: str = ""           # what γ means for this method (registry), for the field's info line
    reasons: tuple[str, ...] = ()  # one clause per hidden field
    tree: bool = False             # the tree's shape (static or dynamic) and a dynamic tree's size: only on a tree

    def note_html(self, elem_id: str = "method-note", why: str = "") -> str:
        """The one line under the form: why the hidden fields are hidden, and `why` the defaults are what they are
        (the default race chosen on this machine; empty when there is nothing to say)."""
        text = " · ".join(self.reasons + ((why[0].upper() + why[1:],) if why else ()))
        return f'<div class="sv-method-note" id="{elem_id}">{html.escape(text)}</div>' if text else ""


def _tree_methods() -> str:
    return ", ".join(methods.names(lambda s: s.tree and bool(s.grafts)))


def race_fields(method: str) -> Fields:
    """The race form's draft model, γ, prompt lookup and datastore fields for `method`."""
    s = methods.spec(method)
    reasons = []
    if not s.uses_draft_model:
        reasons.append(f"No draft model ({s.name}: {s.description})")
    lookup, retrieve = "lookup" in s.grafts, "retrieve" in s.grafts
    if not lookup and not retrieve:
        reasons.append(f"no tree shape, prompt lookup or datastore branch: those hang on a tree ({_tree_methods()}), "
                       f"and the {s.name} method drafts a {s.drafts}")
    elif not (lookup and retrieve):
        missing = "prompt lookup" if not lookup else "datastore"
        reasons.append(f"no {missing} branch: {s.name}'s tree does not take one")
    if not s.gamma_applies:
        reasons.append(f"no γ: {s.label} fixes how far it drafts")
    return Fields(s.uses_draft_model, s.gamma_applies, lookup, retrieve, s.gamma, tuple(_capital(reasons)), s.tree)


def tree_settings(method: str, shape: str, nodes) -> dict:
    """DecodeConfig's tree fields from the race form: the tree's shape and a dynamic tree's node count for a method
    that drafts a tree, nothing for the others (their hidden fields may still hold a value)."""
    return {"tree": shape, "tree_nodes": nodes} if race_fields(method).tree else {}


def step_fields(method: str) -> Fields:
    """The step-through form's draft model and γ for `method` (it drafts a chain there: no branches)."""
    s = methods.spec(method)
    reasons = [] if s.uses_draft_model else [f"No draft model ({s.name}: {s.description})"]
    gamma_info = "drafted tokens per step (a chain here)" if s.gamma_applies else ""
    if not s.gamma_applies:
        reasons.append(f"no γ: {s.label} fixes how far it drafts")
    return Fields(s.uses_draft_model, s.gamma_applies, False, False, gamma_info, tuple(_capital(reasons)))


def _capital(reasons: list[str]) -> list[str]:
    return [r[:1].upper() + r[1:] for r in reasons]
