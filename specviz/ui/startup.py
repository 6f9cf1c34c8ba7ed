"""The app's start-up, in the background: the page answers at once while the models load and this machine is measured.

app.main() launches the server first and runs the warm-up (`warm_up`: the models, then this machine's calibration,
specviz/calibration.py) in a thread through `STATE.begin`; the warm-up tells `STATE.say` each step. The race tab
shows the latest step in a small line (`progress_line`) fed by a timer (`follow_ready`), which stops once the machine's
race is settled and then moves the race form, and an empty pane's title, to that race (when the form still holds the
shipped default). A race started before that
runs the shipped default (hardware.EMBEDDED_PAIR's race: no calibration needed) and its status line says so
(`default_note`, `noted`); while a race runs, the measurement waits between its rounds, so neither disturbs the
other's clock.
"""
from __future__ import annotations

import contextlib
import html
import logging
import threading
import time
from dataclasses import replace
from typing import Callable, Iterator, Optional

import gradio as gr
from gradio.context import Context

from specviz import calibration, hardware
from specviz.config import DEFAULT_TARGET
from specviz.ui.logic import DEFAULT_PROMPT, make_config, method_label, race_result
from specviz.ui.wiring import by_name

log = logging.getLogger("specviz.startup")

TICK_S = 1.0  # how often an open page asks for the start-up's progress, until it is ready
# the fields that follow the race form's method (race.method_changed's outputs, by name)
FOLLOWS = ("draft", "gamma", "lookup", "retrieve", "method_note", "tree", "tree_nodes")
MEASURING = ("measuring", "checking")  # the steps that time this machine: they wait for the races running to end
STYLE = "font-size: 0.9em; opacity: 0.85; margin: 2px 0"  # a small line (the race tab's style.css is not ours)


class Startup:
    """The start-up's state, shared by the warm-up thread and the handlers: its latest line, whether it has begun and
    finished, and how many races run now (the measurement waits for none)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.line = ""
        self.begun = False
        self.done = False
        self.failed = False
        self.races = 0
        self.started = time.monotonic()

    @property
    def pending(self) -> bool:
        """Begun and not finished: the default race is still the shipped one, the machine not measured yet."""
        return self.begun and not self.done

    def say(self, line: str) -> None:
        """The warm-up's next step (logged too). A step that times this machine (MEASURING) waits here for the races
        running to end."""
        with self._cond:
            self.line = line
            log.info("%s", line)
            if line.startswith(MEASURING) and self.races:
                self.line = f"{line} (paused while a race runs)"
                self._cond.wait_for(lambda: self.races == 0)
                self.line = line

    @contextlib.contextmanager
    def racing(self):
        with self._cond:
            self.races += 1
        try:
            yield
        finally:
            with self._cond:
                self.races -= 1
                self._cond.notify_all()

    def begin(self, work: Callable[[Callable[[str], None]], str],
              after: Optional[Callable[[], None]] = None) -> threading.Thread:
        """Run `work(say)` in a daemon thread; the line it returns is the last ("ready: …"). A failure is one line
        (the traceback to the log) and the shipped defaults stay. Then `after()` (what the default race does not
        need), once no race runs."""
        self.begun, self.done, self.failed, self.started = True, False, False, time.monotonic()

        def run() -> None:
            try:
                final = work(self.say)
            except Exception as exc:  # the app keeps serving with the shipped defaults
                log.error("the start-up failed", exc_info=exc)
                final = (f"start-up failed ({type(exc).__name__}; the server log has the traceback): racing the "
                         f"shipped default {hardware.default_pair().race()}")
                self.failed = True
            log.info("%s", final)
            with self._cond:
                self.line, self.done = final, True
                self._cond.wait_for(lambda: self.races == 0)
            try:
                if after is not None:
                    after()
            except Exception as exc:
                log.error("loading after the start-up failed", exc_info=exc)

        thread = threading.Thread(target=run, name="specviz-startup", daemon=True)
        thread.start()
        return thread


STATE = Startup()


def default_note(cfg, state: Startup = STATE) -> str:
    """One line for a race that runs the shipped default because this machine is still being measured; "" otherwise
    (after the start-up, or for settings of the user's own)."""
    if not state.pending:
        return ""
    pair = hardware.default_pair()
    if (cfg.method, cfg.gamma, cfg.lookup, cfg.retrieve) != (pair.method, pair.gamma, pair.lookup_for(pair.method),
                                                             pair.retrieve_for(pair.method)):
        return ""
    return (f"ran the shipped default {pair.race()}, as this machine was still being measured: once the line above "
            "says ready, Run races this machine's own")


def noted(stream: Iterator, note: str, state: Startup = STATE) -> Iterator:
    """A race's items passed through, the race counted as running (the measurement waits for it); a View's status
    line gets `note` after it."""
    with state.racing():
        for item in stream:
            if note and hasattr(item, "status") and item.status:
                note_html = f'<div class="sv-startup-note" style="{STYLE}">Note: {html.escape(note)}</div>'
                item = replace(item, status=item.status + note_html)
            yield item


def line_html(state: Startup = STATE) -> str:
    """The progress line: empty where no start-up runs in the background (a test's in-process app)."""
    if not state.begun:
        return ""
    mark = "⚠" if state.failed else "✓" if state.done else "●"
    elapsed = "" if state.done else f" ({time.monotonic() - state.started:.0f} s)"
    return (f'<div class="sv-startup" id="startup-line" data-done="{str(state.done).lower()}" style="{STYLE}">{mark} '
            f'{html.escape(state.line)}{elapsed}</div>')


def progress_line(state: Startup = STATE) -> gr.HTML:
    """The start-up's progress line, placed under the race form (follow_ready refreshes it)."""
    return gr.HTML(lambda: line_html(state), elem_id="startup")  # the current line at each page load


def follow_ready(line: gr.HTML, form, shipped: hardware.Pair, follow: Callable, status: gr.HTML, pane: gr.HTML,
                 empty_pane: Callable[[str], str], state: Startup = STATE) -> None:
    """Refresh `line` every TICK_S until ready; then move the race form to this machine's race if it still holds
    the shipped default `shipped`: its method, and the fields that follow the method (`follow(method)`:
    race.method_changed's updates by name, of FOLLOWS); and where no race has been shown yet (an empty `status`),
    the empty speculative `pane`'s title too (`empty_pane(method)`), so the page names the race Run starts."""
    timer = gr.Timer(TICK_S)

    def tick(method, gamma, lookup, retrieve, shown):
        if not state.done and state.begun:
            return {"line": line_html(state)}
        pair = hardware.default_pair()
        as_shipped = (str(method), str(gamma), str(lookup), str(retrieve)) == (
            shipped.method, str(shipped.gamma), str(shipped.lookup_for(shipped.method)),
            str(shipped.retrieve_for(shipped.method)))
        if not as_shipped or pair.race() == shipped.race():
            return {"line": line_html(state), "timer": gr.Timer(active=False)}
        moved = {"line": line_html(state), "timer": gr.Timer(active=False), "method": gr.update(value=pair.method),
                 **follow(pair.method)}
        return {**moved, "pane": empty_pane(pair.method)} if not shown else moved

    handler, outputs = by_name(tick, {"line": line, "timer": timer, "method": form.method, "pane": pane,
                                      **form.named(*FOLLOWS)})
    inputs = [form.method, form.gamma, form.lookup, form.retrieve, status]
    timer.tick(handler, inputs=inputs, outputs=outputs, queue=False, show_progress="hidden", api_visibility="private")
    # and once as the page opens: a page opened after ready names this machine's race at once, not a tick later
    Context.root_block.load(handler, inputs=inputs, outputs=outputs, queue=False, show_progress="hidden",
                            api_visibility="private")


# ── the warm-up the app runs in the background ──────────────────────────────────────────────────────────────

def warm_up(say: Optional[Callable[[str], None]] = None, on_zero_gpu: bool = False) -> str:
    """Load this machine's default pair once (and the embedded target the trained drafters are tied to), run the
    default race for a few tokens so the first click answers at once, and settle this machine's race from its
    calibration (hardware.adopt: kept per machine, measured where none is kept); `say` is told each step (app.main()
    runs this in the background through STATE.begin; the race tab shows the steps). Returns the last line ("ready:
    …"). On ZeroGPU no GPU is attached outside the wrapped handlers: the models load (each worker inherits them) and
    nothing runs."""
    from specviz.core import profile, retrieval
    from specviz.models import drafts
    from specviz.models import loader as models

    say = say or (lambda line: print(f"specviz: {line}", flush=True))
    pair = hardware.default_pair()
    if pair.note:
        say(pair.note)
    say(f"loading the model {pair.target}…")
    target = models.get(pair.target)
    if pair.target != DEFAULT_TARGET:
        models.get(DEFAULT_TARGET)
    if pair.retrieve_for(pair.method):
        say("loading the datastore (the target's past answers)…")
        retrieval.datastore_for(pair.target)  # the default race's datastore branch: built once, here
    if on_zero_gpu:
        drafts.load_draft(pair.draft, target)
        return f"models ready on {hardware.describe(target.device, target.dtype)}"
    say(f"loading the drafter: a first short race of {pair.race()}…")  # the drafter loads, the kernels are picked
    race_result(DEFAULT_PROMPT, make_config(pair.method, pair.gamma, lookup=pair.lookup_for(pair.method),
                                            retrieve=pair.retrieve_for(pair.method), max_new_tokens=16),
                pair.draft, pair.target)
    why = hardware.adopt(target, say)  # the default race, chosen from this machine's T(k) and step costs
    if why:
        print(f"specviz: {why}", flush=True)
    prof = profile.profile_of(target, measure=False)
    if prof is not None:
        print("specviz: verify cost T(k)/T(1): " + ", ".join(f"k={k} {prof.ratio(k):.2f}" for k in (2, 5, 8, 17)),
              flush=True)
    tuned = hardware.default_pair()
    print(f"specviz: models ready on {hardware.describe(target.device, target.dtype)} "
          f"({target.guarantee} verification)", flush=True)
    return ready_line(calibration.outcome(target), tuned)


def load_draft() -> None:
    """The default pair's draft model (vanilla's; on a CPU the int8 copy, a few seconds to make), once the app is
    ready: the default race does not need it."""
    from specviz.models import drafts
    from specviz.models import loader as models

    pair = hardware.default_pair()
    drafts.load_draft(pair.draft, models.get(pair.target))
    print(f"specviz: {pair.draft} draft loaded (vanilla's)", flush=True)


def ready_line(outcome: Optional[calibration.Outcome], pair: hardware.Pair) -> str:
    """The start-up's last line: the race this machine runs and where its figures came from."""
    if outcome is None or outcome.source == "none":
        return f"ready: racing {pair.race()}"
    if outcome.source == "shipped":
        return f"ready: racing the shipped default {pair.race()} (SPECVIZ_CALIBRATE=0 and no valid kept calibration)"
    how = "this machine's kept calibration" if outcome.source == "kept" else "measured now, kept for the next start"
    label = method_label(pair.method, pair.lookup_for(pair.method), pair.retrieve_for(pair.method))
    return f"ready: this machine races {label} ({pair.race()}; {how})"
