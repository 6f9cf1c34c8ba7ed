"""`python -m specviz watch URL`: scrape a serving engine's /metrics every interval, take windows between scrapes,
and show them live (a rich panel on a terminal, one plain line a window otherwise); at the end a summary over the
whole watch, and with json_path the series and the summary as JSON. A failed scrape mid-watch is one line and the
series is kept; a counter reset (a server restart) is one line and counting restarts from the new values. When τ
stays near 1.0 or acceptance halves against its start (serving/alarm.py), an ALARM line (red on a terminal)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional, TextIO

from specviz.serving.alarm import Alarm, alarm
from specviz.serving.prometheus import ServerError, Snapshot, Watch, Window, metrics_url, no_speculation, scrape

INTERVAL = 2.0  # seconds between scrapes


def _f(value: Optional[float], spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _rate(value: float, w: Window) -> Optional[float]:
    return value / w.seconds if w.seconds > 0 else None


def window_line(w: Window, since: float) -> str:
    """One window as a plain line."""
    line = (f"+{w.t1 - since:6.1f}s  τ={_f(w.tau)}  acceptance={_f(w.acceptance_rate)}  drafted "
            f"{_f(_rate(w.draft_tokens, w), '.1f')} tok/s  accepted {_f(_rate(w.accepted_tokens, w), '.1f')} tok/s  "
            f"running {_f(w.requests_running, '.0f')}")
    if w.per_position:
        line += "  by position " + " ".join(f"{a:.2f}" for a in w.per_position)
    return line + ("  (server restarted: counting from the new values)" if w.reset else "")


def prediction_line(s: dict) -> str:
    """Leviathan's prediction as a watch states it: at the per-token α whose chain of γ gives the measured τ."""
    bound = " (drafting free: an upper bound)" if not s["cost_ratio"] else ""
    return (f"Leviathan prediction at α={_f(s['alpha_per_token'])} per token (the α whose chain of γ={s['gamma']}, "
            f"{s['gamma_from']}, gives τ={_f(s['tau'])}), c={s['cost_ratio']:g}: {s['predicted_speedup']:.2f}×{bound}")


def summary_lines(s: dict) -> list[str]:
    """The whole watch, for the terminal."""
    lines = [f"engine {s['engine']} · {s['seconds']:.0f} s · {s['drafts']:.0f} drafts, {s['draft_tokens']:.0f} drafted "
             f"and {s['accepted_tokens']:.0f} accepted tokens · τ={_f(s['tau'])} · draft acceptance "
             f"{_f(s['acceptance_rate'])} (of every drafted token, as vLLM counts; not specviz's α, kept / judged)"
             + (f" · tokens per target forward {_f(s['tokens_per_forward'])}" if s["tokens_per_forward"] else "")]
    if s["per_position"]:
        lines.append("acceptance by position (share of drafts): " + " ".join(f"{a:.2f}" for a in s["per_position"])
                     + " · α_i (given the earlier ones): " + " ".join(_f(a) for a in s["per_position_conditional"]))
    if s["predicted_speedup"] is not None:
        lines.append(prediction_line(s))
    if s["resets"] or s["failed_scrapes"]:
        lines.append(f"{s['resets']} server restart(s), {len(s['failed_scrapes'])} failed scrape(s)")
    lines += [f"+{a['at']:.1f}s {a['line']}" for a in s.get("alarms", [])]
    lines.append("verdict: " + s["verdict"])
    return lines


class PlainView:
    """Not a terminal: one line per window, one per note."""

    def __init__(self, out: TextIO, url: str, since: float):
        self.out, self.since = out, since
        print(f"watching {metrics_url(url)}", file=out, flush=True)

    def update(self, watch: Watch, w: Window) -> None:
        print(window_line(w, self.since), file=self.out, flush=True)

    def note(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def raise_alarm(self, a: Optional[Alarm], line: str) -> None:
        if line:
            print(line, file=self.out, flush=True)

    def close(self) -> None:
        pass


class LiveView:
    """A terminal: a rich panel redrawn after each scrape."""

    def __init__(self, out: TextIO, url: str, since: float):
        from rich.console import Console
        from rich.live import Live

        self.url, self.since, self.notes, self.alarm = metrics_url(url), since, [], None
        self.live = Live(self._render(None, None), console=Console(file=out), refresh_per_second=4)
        self.live.start()

    def _render(self, watch: Optional[Watch], w: Optional[Window]):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        if watch is None or w is None:
            return Panel(Text("waiting for the second scrape…"), title=f"specviz watch {self.url}")
        s = watch.summary()
        colour = {"idle": "yellow", "few drafts": "yellow", "collapsed": "red",
                  "healthy": "green"}[s["verdict"].split(":")[0]]
        table = Table(box=None)
        for col in ("", "τ", "draft acceptance", "drafted tok/s", "accepted tok/s", "requests running"):
            table.add_column(col, justify="right")
        table.add_row("last window", _f(w.tau), _f(w.acceptance_rate), _f(_rate(w.draft_tokens, w), ".1f"),
                      _f(_rate(w.accepted_tokens, w), ".1f"), _f(w.requests_running, ".1f"))
        table.add_row(f"{s['seconds']:.0f} s", _f(s["tau"]), _f(s["acceptance_rate"]),
                      _f(s["draft_tokens_per_s"], ".1f"), _f(s["accepted_tokens_per_s"], ".1f"),
                      _f(s["requests_running"], ".1f"))
        parts = [Text(s["verdict"], style=f"bold {colour}"), table]
        if self.alarm is not None:
            parts.insert(0, Text(self.alarm.line, style="bold white on red"))
        if s["per_position"]:
            pos = Table(box=None, title="acceptance by draft position")
            for col in ("position", "share of drafts", "α_i", ""):
                pos.add_column(col, justify="right" if col else "left")
            for i, (a, c) in enumerate(zip(s["per_position"], s["per_position_conditional"])):
                pos.add_row(str(i + 1), f"{a:.2f}", _f(c), "█" * round(a * 30))
            parts.append(pos)
        if s["predicted_speedup"] is not None:
            parts.append(Text(prediction_line(s)))
        parts += [Text(n, style="yellow") for n in self.notes[-3:]]
        return Panel(Group(*parts), title=f"specviz watch {self.url} · {s['engine']}")

    def update(self, watch: Watch, w: Window) -> None:
        self.live.update(self._render(watch, w))

    def note(self, line: str) -> None:
        self.notes.append(line)

    def raise_alarm(self, a: Optional[Alarm], line: str) -> None:
        self.alarm = a

    def close(self) -> None:
        self.live.stop()


def run(url: str, interval: float = INTERVAL, duration: Optional[float] = None, gamma: Optional[int] = None,
        json_path: Optional[str] = None, cost_ratio: float = 0.0, out: TextIO = sys.stdout,
        live: Optional[bool] = None, read: Callable[[str], Snapshot] = scrape, command: str = "",
        drafter: Optional[str] = None) -> Watch:
    """Watch until `duration` seconds have passed (None: until interrupted). ServerError when the first scrape
    fails or the server exports no speculative figures; later failures are notes and the series is kept."""
    watch = Watch(gamma=gamma, cost_ratio=cost_ratio, drafter=drafter)
    first = read(url)
    if not first.speculative:
        raise ServerError(no_speculation(url, first))
    watch.add(first)
    since = first.t
    live = out.isatty() if live is None else live
    view = (LiveView if live else PlainView)(out, url, since)
    ticks, raised = 0, []  # raised: each change of the alarm (None: it ended)
    try:
        while duration is None or time.monotonic() - since < duration:
            ticks += 1
            wake = since + ticks * interval
            if duration is not None:
                wake = min(wake, since + duration)
            time.sleep(max(0.0, wake - time.monotonic()))
            try:
                snap = read(url)
            except ServerError as exc:
                watch.failures.append(f"+{time.monotonic() - since:.1f}s {exc}")
                view.note(f"+{time.monotonic() - since:.1f}s scrape failed: {exc} (the series so far is kept)")
                continue
            w = watch.add(snap)
            if w.reset:
                view.note(f"+{w.t1 - since:.1f}s the server restarted (counters went backwards): counting again from "
                          "its new values")
            now = alarm(watch.series, collapse_tau=watch.collapse_tau)
            if (now and now.kind) != (raised[-1].kind if raised and raised[-1] else None):  # raised, changed, ended
                raised.append(now)
                view.raise_alarm(now, f"+{w.t1 - since:.1f}s {now.line}" if now else
                                 f"+{w.t1 - since:.1f}s the alarm has ended: the last windows are healthy again")
            view.update(watch, w)
    except KeyboardInterrupt:
        pass
    finally:
        view.close()
    summary = watch.summary()
    summary["alarms"] = [{"at": a.t1 - since, "kind": a.kind, "line": a.line} for a in raised if a]
    for line in summary_lines(summary):
        print(line, file=out)
    if json_path:
        data = {"url": metrics_url(url), "command": command, "interval": interval, "duration": duration,
                "series": [w.to_dict() for w in watch.series], "summary": summary}
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(data, indent=1, ensure_ascii=False))
        print(f"wrote {json_path}", file=out)
    return watch
