"""specviz web app: plain autoregressive decoding and speculative decoding, side by side, live.

`python app.py` serves on 127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override). This file composes the
tabs, one module each in specviz/ui/ (race.py, many.py, check.py, step.py, watch.py), and launches; then it loads this
machine's default pair (specviz/hardware.py) and settles its race (specviz/calibration.py) in the background, the race
tab showing the progress (specviz/ui/startup.py). On ZeroGPU, specviz/zerogpu.py wraps the handlers that run models
and the models load before launch.
"""
from __future__ import annotations

import logging
import os
import sys

import gradio as gr

from specviz import calibration, hardware, zerogpu
from specviz.errors import ConfigError
from specviz.serving import export
from specviz.ui import check, many, race, startup, step, watch
from specviz.ui.common import DEVICE_QUEUE

TITLE = ("# specviz — speculative decoding, live\n"
         "A small drafter guesses ahead, the target model checks several guesses in one pass. "
         "Same model, same CPU: plain decoding on the left, speculative on the right.")


def build_ui() -> gr.Blocks:
    """The tabs, composed; loads nothing (models load in main()'s warm-up or on the first run). The tabs that run
    models share one queue for the device (common.DEVICE_QUEUE), so runs never disturb each other's timing."""
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


def after_start() -> None:
    """Once the app is ready: the counters of this machine's race at zero, then vanilla's draft model."""
    export.APP.declare(race.counter_label(hardware.default_pair()))
    startup.load_draft()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("specviz").setLevel(logging.INFO)  # our errors, with tracebacks, go to the server log
    try:
        calibration.mode()  # a bad SPECVIZ_CALIBRATE: one line, before anything loads
    except ConfigError as exc:
        print(f"specviz: {exc}", file=sys.stderr)
        sys.exit(2)  # bad input, as the CLI answers it
    on_zero_gpu = zerogpu.activate()  # imports spaces before any model touches CUDA
    if on_zero_gpu:
        startup.warm_up(on_zero_gpu=True)  # before launch: ZeroGPU's workers inherit what is loaded
    demo = build_ui().queue(default_concurrency_limit=1)
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                show_error=False,  # handlers turn every error into a one-line gr.Error; nothing else reaches a user
                prevent_thread_lock=True, **launch_options())
    if not on_zero_gpu:  # the page answers first; the models load and the machine is measured behind it
        startup.STATE.begin(startup.warm_up, after=after_start)
    demo.block_thread()


if __name__ == "__main__":
    main()
