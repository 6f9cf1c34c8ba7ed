"""Gradio outputs wired by name, not by position.

A handler returns (or yields) {output name: value}: only the outputs that change, each named; `by_name` maps the names
to the event's components ({component: value}, which gradio applies by component, leaving the others as they are).
Adding an output cannot shift the others, and a name the event does not list fails at once, naming it.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Mapping

import gradio as gr


def keyed(values: Mapping[str, object], outputs: Mapping[str, object]) -> dict:
    """{name: value} -> {component: value} (nothing: gr.skip(), every output unchanged); a name not among `outputs` is
    a KeyError naming it and the names known."""
    unknown = sorted(set(values) - set(outputs))
    if unknown:
        raise KeyError(f"outputs {unknown} are not wired: this event's outputs are {sorted(outputs)}")
    if not values:
        return gr.skip()
    return {outputs[name]: value for name, value in values.items()}


def by_name(fn: Callable, outputs: Mapping[str, object]) -> tuple[Callable, list]:
    """(handler, outputs list) for gradio's event listener: `fn`, which returns or yields {name: value}, as a handler
    of the same signature and kind (generator or not) that returns {component: value}; the list is the components."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def handler(*args, **kwargs):
            for values in fn(*args, **kwargs):
                yield keyed(values, outputs)
    else:
        @functools.wraps(fn)
        def handler(*args, **kwargs):
            return keyed(fn(*args, **kwargs), outputs)
    return handler, list(outputs.values())
