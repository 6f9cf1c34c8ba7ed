"""specviz web app: plain autoregressive decoding and speculative decoding, side by side, live.

`python app.py` serves on 127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override). This file composes the
tabs, one module each in specviz/ui/ (race.py, many.py, check.py, step.py, watch.py), loads this machine's default pair
(specviz/hardware.py) in main() and launches; on ZeroGPU, specviz/zerogpu.py wraps the handlers that run models.
"""
from __future__ import annotations

import logging
import os

import gradio as gr

from specviz import hardware, zerogpu
from specviz.config import DEFAULT_TARGET
from specviz.serving import export
from specviz.ui import check, many, race, step, watch
from specviz.ui.common import DEVICE_QUEUE
from specviz.ui.logic import DEFAULT_PROMPT, make_config, race_result

TITLE = ("# specviz — speculative decoding, live\n"
         "A small drafter guesses ahead, the target model checks several guesses in one pass. "
         "Same model, same CPU: plain decoding on the left, speculative on the right.")


def build_ui() -> gr.Blocks:
    """The tabs, composed; loads nothing (models load in main() or on the first run). The tabs that run models
    share one queue for the device (common.DEVICE_QUEUE), so runs never disturb each other's timing."""
    pair = hardware.default_pair()
    with gr.Blocks(title="specviz: speculative decoding, live", analytics_enabled=False) as demo:
        gr.Markdown(TITLE, elem_id="title")
        race.race_tab(DEVICE_QUEUE, pair)
        many.many_tab(DEVICE_QUEUE)
        check.check_tab(DEVICE_QUEUE, pair)
        step.step_tab(DEVICE_QUEUE, pair)
        watch.watch_tab()
    export.APP.declare(race.counter_label(pair))  # the default race's counters, at zero until it runs
    return demo


def launch_options() -> dict:
    """What launch() adds to gradio's FastAPI app: the /metrics route of the app's own counters."""
    return {"app_kwargs": {"routes": [export.metrics_route()]}}


def warm_up(on_zero_gpu: bool = False) -> None:
    """Load this machine's default pair once (and the embedded target the trained drafters are tied to), then
    run a few tokens so the first click answers at once. On ZeroGPU no GPU is attached outside the wrapped
    handlers: the models load (each worker inherits them) and nothing runs."""
    from specviz.core import profile, retrieval
    from specviz.models import loader as models

    pair = hardware.default_pair()
    if pair.note:
        print(f"specviz: {pair.note}", flush=True)
    print(f"specviz: loading {pair.target} and the {pair.draft} draft…", flush=True)
    target = models.get(pair.target)
    models.load_draft(pair.draft, target)
    if pair.retrieve_for(pair.method):
        retrieval.datastore_for(pair.target)  # the default race's datastore branch: built once, here
    if pair.target != DEFAULT_TARGET:
        models.get(DEFAULT_TARGET)
    if not on_zero_gpu:
        race_result(DEFAULT_PROMPT, make_config(max_new_tokens=16), pair.draft, pair.target)  # kernels picked
        prof = profile.profile_of(target)  # the verify profile the summary's prediction reads
        print("specviz: verify cost T(k)/T(1): " + ", ".join(f"k={k} {prof.ratio(k):.2f}" for k in (2, 5, 8, 17)),
              flush=True)
        why = hardware.adopt(target)  # the default race, chosen from this machine's T(k) and step costs
        if why:
            print(f"specviz: {why}", flush=True)
    print(f"specviz: models ready on {hardware.describe(target.device, target.dtype)} "
          f"({target.guarantee} verification)",
          flush=True)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("specviz").setLevel(logging.INFO)  # our errors, with tracebacks, go to the server log
    on_zero_gpu = zerogpu.activate()  # imports spaces before any model touches CUDA
    warm_up(on_zero_gpu)
    demo = build_ui()
    demo.queue(default_concurrency_limit=1).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        show_error=False,  # handlers turn every error into a one-line gr.Error; nothing else reaches a user
        **launch_options(),
    )


if __name__ == "__main__":
    main()
