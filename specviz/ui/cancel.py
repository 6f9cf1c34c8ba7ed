"""Stopping a run on the server when nobody waits for it any more.

Gradio runs a plain (non-generator) handler such as /race in a worker thread, and a cancel (`job.cancel()` in
gradio_client, which the page's Stop uses too) only cancels the asyncio task awaiting that thread: the thread races on
to the end, beside the next visitor's race, and the queue's one-at-a-time limit is bypassed. A client that dies
mid-run is not even cancelled: gradio marks its job dead and waits for the thread. `cancellable` runs such a handler
in a thread of its own with a stop signal (core.race.STOP, checked by the race between two steps), sets the signal
when the request is cancelled or its client is gone, and returns only once the race has stopped, so the queue's slot
is held until the engines are idle.

(A streaming handler needs none of this: gradio closes its generator at the next yield on a cancel or a lost client,
and closing it unwinds the race. The race tab's throttle yields at least every UPDATE_INTERVAL_S while tokens come.)
"""
from __future__ import annotations

import asyncio
import functools
import threading
from typing import Callable

import gradio as gr

from specviz.core.race import STOP, Cancelled

POLL_S = 0.1  # how often a waiting handler looks whether its client is still there


def client_gone() -> Callable[[], bool]:
    """True once gradio's queue has marked the current event dead (its client's stream closed). Reads gradio's
    queue through its LocalContext; on a gradio without them, never True (a cancel still stops the run)."""
    try:
        from gradio.context import LocalContext

        blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
        events = blocks._queue.event_ids_to_events
    except Exception:
        return lambda: False

    def gone() -> bool:
        event = events.get(event_id)
        return event is not None and not getattr(event, "alive", True)

    return gone


def cancellable(fn: Callable) -> Callable:
    """`fn` (a plain handler that runs a race) as an async handler with fn's signature: fn runs in a thread with a
    stop signal that a cancel or a lost client sets; the race then ends within one engine step, and only then does
    the handler return (a stopped run answers with a one-line gr.Error nobody reads)."""

    @functools.wraps(fn)
    async def run(*args, **kwargs):
        stop = threading.Event()
        gone = client_gone()

        def work():
            STOP.set(stop.is_set)  # this thread's context: the race reads it between steps
            return fn(*args, **kwargs)

        task = asyncio.ensure_future(asyncio.to_thread(work))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=POLL_S)
                if not task.done() and gone():
                    stop.set()
        except asyncio.CancelledError:
            stop.set()
            await asyncio.wait({task})  # the engines stop within a step; the queue's slot stays held until then
            if not task.cancelled():
                task.exception()  # retrieved: the Cancelled it ended with is no error to log
            raise
        try:
            return task.result()
        except Cancelled:
            raise gr.Error("the run was stopped: its request was cancelled or its client went away",
                           print_exception=False) from None

    return run
