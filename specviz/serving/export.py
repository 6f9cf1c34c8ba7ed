"""specviz's own runs as Prometheus counters under the names the serving engines export, so that a dashboard built
for vLLM (or `python -m specviz watch`) reads specviz too: the app's `/metrics` route and `--metrics-file` on
`generate` and `bench` render the same text.

    specviz:spec_decode_num_drafts_total                                   counter
    specviz:spec_decode_num_draft_tokens_total                             counter
    specviz:spec_decode_num_accepted_tokens_total                          counter
    specviz:spec_decode_num_accepted_tokens_per_pos_total{position="i"}    counter
    specviz:generation_tokens_total                                        counter
    specviz:num_requests_running                                           gauge

Every counter carries a `method` label (the race's method as the bench writes it, e.g. `eagle+pld+ret`), the way
vLLM's carry `model_name`. The counters are fed from the speculative lane's StepEvents (specviz/events.py), one
event per target forward, with these definitions, the same for chains and trees and as vLLM counts them:

- a *draft* is one target forward that verified drafted tokens (a StepEvent with drafts). A forward that had
  nothing to verify (prompt lookup without a match) is no draft;
- its *draft tokens* are every token it proposed for that verification: a chain's γ drafted tokens, those after a
  refusal (never judged) included; a tree's every candidate node, grafted branches included (the target verifies
  them all in the one forward);
- its *accepted tokens* are the drafted tokens the target kept (the target's own resampled or bonus token is not
  one), so τ = 1 + accepted / drafts and draft acceptance = accepted / draft tokens (metrics.PROPOSED_ACCEPTANCE:
  "acceptance of every drafted token, as vLLM counts", what Watch shows). It is not the α that the race, bench and
  check show (metrics.ACCEPTANCE: accepted / the drafted tokens the target judged, the drafts on the verified path),
  and is lower wherever drafts go unjudged (after a chain's refusal; a tree's other branches): on one race the
  summary's α card gives both (tests/test_acceptance_definition.py checks each against the events);
- *position* i (0-based) is a chain's i-th drafted token, a tree's depth i on the accepted path; the per-position
  counter counts the drafts whose position i was accepted, so α_i = per_pos[i] / drafts is the unconditional
  P(position i accepted), where metrics.summarize's alpha_by_position is conditional on the positions before it.

`generation_tokens_total` counts the tokens the speculative lane emitted; `num_requests_running` the races (or
commands) generating now. The app's counters add `specviz:race_steps_total`, the engine steps (both lanes) its races
have run: it grows only while a race computes, so it shows a stopped race has stopped. No torch here; a registry
of its own per Exporter, never prometheus_client's global one.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, write_to_textfile

from specviz.errors import ConfigError
from specviz.events import StepEvent, Verdict

PREFIX = "specviz:"
# the /metrics route's media type: the classic text format generate_latest writes (as vLLM and llama.cpp serve it)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Exporter:
    """specviz's counters in a registry of their own: `observe` each speculative StepEvent, `running()` around a
    run, `text()` or `write(path)` to export."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.drafts = Counter(PREFIX + "spec_decode_num_drafts", "Target forwards that verified drafted tokens.",
                              ["method"], registry=r)
        self.draft_tokens = Counter(PREFIX + "spec_decode_num_draft_tokens",
                                    "Every drafted token proposed for verification, judged or not (a chain's "
                                    "gamma, a tree's every node), as vLLM counts; accepted / this is not "
                                    "specviz's alpha (accepted / judged).",
                                    ["method"], registry=r)
        self.accepted = Counter(PREFIX + "spec_decode_num_accepted_tokens", "Drafted tokens the target kept.",
                                ["method"], registry=r)
        self.per_position = Counter(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                    "Drafts whose drafted token at this 0-based position was kept.",
                                    ["method", "position"], registry=r)
        self.tokens = Counter(PREFIX + "generation_tokens", "Tokens the speculative lane emitted.", ["method"],
                              registry=r)
        self.requests = Gauge(PREFIX + "num_requests_running", "Speculative runs generating now.", registry=r)

    def declare(self, method: str) -> None:
        """Show `method`'s counters at zero before its first run (a scrape of an idle app finds them)."""
        for counter in (self.drafts, self.draft_tokens, self.accepted, self.tokens):
            counter.labels(method)

    def observe(self, event: StepEvent, method: str) -> None:
        """Count one target forward of a speculative run."""
        self.tokens.labels(method).inc(len(event.emitted))
        if not event.drafts:
            return
        self.drafts.labels(method).inc()
        self.draft_tokens.labels(method).inc(len(event.drafts))
        kept = [d.depth for d in event.drafts if d.verdict is Verdict.ACCEPTED]
        self.accepted.labels(method).inc(len(kept))
        for depth in kept:
            self.per_position.labels(method, str(depth)).inc()

    def observe_run(self, events: Iterable[StepEvent], method: str) -> None:
        """Count a finished run's events."""
        for event in events:
            self.observe(event, method)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """One run in progress (num_requests_running) for the duration of the block."""
        with self.requests.track_inprogress():
            yield

    def metered(self, events: Iterable[StepEvent], method: str) -> Iterator[StepEvent]:
        """Pass a speculative event stream through, counting each event, with the run counted as running."""
        with self.running():
            for event in events:
                self.observe(event, method)
                yield event

    def text(self) -> str:
        """The Prometheus text exposition of every counter."""
        return generate_latest(self.registry).decode("utf-8")

    def write(self, path: str | Path) -> None:
        """Write the text exposition to `path` (atomically: a scraper never reads half a file); ConfigError, one
        line, when it cannot be written."""
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_to_textfile(str(path), self.registry)
        except OSError as exc:
            raise ConfigError(f"metrics-file={str(path)!r} cannot be written ({exc.strerror or type(exc).__name__})") \
                from None


class RaceSteps:
    """A collector of the engine steps this process's races have run (core.race.steps_run), read when scraped."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        from specviz.core.race import steps_run

        yield CounterMetricFamily(PREFIX + "race_steps", "Engine steps run by this process's races, both lanes.",
                                  value=steps_run())


APP = Exporter()  # the app's counters: every race of this process feeds them, its /metrics route renders them
APP.registry.register(RaceSteps())


def metrics_route():
    """A Starlette route serving APP at GET /metrics, for the app's FastAPI (gradio's launch(app_kwargs=...))."""
    from starlette.responses import Response
    from starlette.routing import Route

    def endpoint(request) -> Response:
        return Response(APP.text(), media_type=CONTENT_TYPE)

    return Route("/metrics", endpoint, methods=["GET"], name="metrics")
