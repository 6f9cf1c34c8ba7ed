"""The check tab's roofline panel: where plain decoding sits against this machine's memory bandwidth, and why
verifying k drafted tokens costs about one step (specviz.core.roofline measures; this module draws)."""
from __future__ import annotations

import html
import threading

import gradio as gr
import plotly.graph_objects as go

from specviz.config import DEFAULT_TARGET
from specviz.core import roofline
from specviz.core.roofline import Roofline
from specviz.ui.plots import CUMULATIVE, ROLLING, figure

SIZES = (1, 2, 4, 8, 16, 32)  # tokens per forward the panel measures
REPS = 3
_bandwidth: dict[str, float] = {}  # device -> bytes/s, measured once per process
_lock = threading.Lock()


def roofline_figure(r: Roofline) -> go.Figure:
    """T(k) as measured against the floor the reads alone set (bytes a forward / read bandwidth), per k."""
    ks = [str(k) for k in r.tokens]
    measured_ms = [1000 * b / (g * 1e9) for b, g in zip(r.bytes_per_step, r.achieved_gb_s)]
    data = [
        {"type": "bar", "x": ks, "y": measured_ms, "name": "T(k) measured", "marker": {"color": ROLLING},
         "text": [f"{g:.0f} GB/s" for g in r.achieved_gb_s], "textposition": "outside", "cliponaxis": False,
         "hovertemplate": "k=%{x}: %{y:.1f} ms, %{text} of weights and KV<extra></extra>"},
        {"type": "scatter", "mode": "lines+markers", "x": ks, "y": r.floor_ms, "name": "floor: bytes ÷ bandwidth",
         "line": {"color": CUMULATIVE, "width": 3, "dash": "dash"}, "marker": {"symbol": "diamond", "size": 9},
         "hovertemplate": "k=%{x}: the reads alone take %{y:.1f} ms<extra></extra>"},
    ]
    title = (f"AR {r.ar_tok_s:.0f} tok/s of a {r.roofline_tok_s:.0f} tok/s ceiling "
             f"({r.ar_share:.0%} of {r.bandwidth_gb_s:.0f} GB/s)")
    return figure(data, title, xaxis={"title": {"text": "tokens per target forward (k)"}, "type": "category"},
                   yaxis={"title": {"text": "ms per forward"}, "rangemode": "tozero"})


def roofline_html(r: Roofline) -> str:
    """The lesson in three sentences, with this machine's figures."""
    t1 = r.bytes_per_step[0] / (r.achieved_gb_s[0] * 1e9)
    ratios = ", ".join(f"T({k})/T(1) = {b / (g * 1e9) / t1:.2f}"
                       for k, b, g in zip(r.tokens, r.bytes_per_step, r.achieved_gb_s) if k in (4, 8, 16))
    note = roofline.probe_note(r)
    return ("<p class='sv-intro'>Each step of plain decoding reads every weight once: "
            f"<b>{r.weight_bytes / 1e6:.0f} MB</b> here, from memory that reads <b>{r.bandwidth_gb_s:.1f} GB/s</b> "
            "on this machine" + (f" ({html.escape(note)})" if note else "")
            + f", so no step can take less than <b>{r.floor_ms[0]:.1f} ms</b> ({r.roofline_tok_s:.0f} "
            f"tok/s). specviz's AR runs at <b>{r.ar_tok_s:.0f} tok/s</b>, "
            f"{r.ar_share:.0%} of that ceiling. A forward of k tokens reads the same weights once for all k rows, "
            f"so verifying k drafts costs far less than k steps ({html.escape(ratios)}): that is the room "
            "speculative decoding fills. Where T(k) climbs above the floor, the arithmetic of k rows, not the "
            "memory, sets the cost.</p>")


def measure(target: str):
    """Profile the target's forwards for SIZES and the read bandwidth (once per process), as the panel's outputs;
    a refused or missing model is one line in the panel."""
    from specviz.core import profile, roofline
    from specviz.models import loader as models
    from specviz.policy import Policy
    from specviz.ui.logic import user_message

    policy = Policy.from_env()
    try:
        loaded = models.get(policy.check_model(str(target or "").strip() or DEFAULT_TARGET, "target"))
    except Exception as exc:  # noqa: BLE001  (ConfigError, ModelError: one line; anything else: logged, one line)
        return f"<p class='sv-verdict sv-verdict-bad'>{html.escape(user_message(exc, policy.public))}</p>", None
    prof = profile.verify_profile(loaded, SIZES, reps=REPS)
    key = str(loaded.device)
    with _lock:
        if key not in _bandwidth:
            _bandwidth[key] = roofline.read_bandwidth(loaded.device)
    r = roofline.roofline(loaded.model, loaded.dtype, prof, _bandwidth[key])
    return roofline_html(r), roofline_figure(r)


def roofline_panel(target: gr.Dropdown, concurrency_id: str) -> None:
    """An accordion in the caller's tab: a button that measures, the lesson, the figure."""
    with gr.Accordion("The roofline: what verifying k tokens costs against one step", open=False,
                      elem_id="roofline"):
        button = gr.Button("Measure this machine", elem_id="roofline-run")
        text = gr.HTML("", elem_id="roofline-text")
        plot = gr.Plot(elem_id="roofline-plot", show_label=False)
    button.click(measure, inputs=[target], outputs=[text, plot], api_name="roofline", concurrency_limit=1,
                 concurrency_id=concurrency_id)
