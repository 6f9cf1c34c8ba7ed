"""The watch's alarm (serving/alarm.py) against a planted collapse: a tiny local HTTP server serving vLLM's
Prometheus text (the names of tests/data/vllm-0.32-metrics.prom) whose acceptance drops at a known scrape. The alarm
must come within two windows of the drop, in the CLI (`watch`) and in the app's tab, and never on a healthy or idle
server. Each server stops after the test (and its test is bounded: the CLI watch runs for a fixed duration)."""
from __future__ import annotations

import html
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specviz.serving import watch as cli
from specviz.serving.alarm import alarm
from specviz.serving.prometheus import Watch, parse, scrape
from specviz.ui import watch as tab

HEALTHY, COLLAPSED, HALVED = (10, 30, 20), (10, 30, 0), (10, 30, 6)  # per scrape: drafts, drafted, accepted


def page(steps: list[tuple[int, int, int]]) -> str:
    """vLLM's counters after these increments (vllm:spec_decode_* as vLLM 0.32 names them)."""
    drafts, drafted, accepted = (sum(s[i] for s in steps) for i in range(3))
    lines = []
    for name, value in (("num_drafts", drafts), ("num_draft_tokens", drafted), ("num_accepted_tokens", accepted)):
        lines += [f"# TYPE vllm:spec_decode_{name}_total counter",
                  f'vllm:spec_decode_{name}_total{{engine="0",model_name="m"}} {float(value)}']
    lines += ["# TYPE vllm:num_requests_running gauge", 'vllm:num_requests_running{engine="0",model_name="m"} 1.0']
    return "\n".join(lines) + "\n"


@pytest.fixture
def planted():
    """start(plan): a server whose n-th GET shows the counters after plan[:n] (the last step repeats)."""
    servers = []

    def start(plan):
        gets = {"n": 0}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                n = gets["n"]
                gets["n"] += 1
                steps = plan[:n] + [plan[-1]] * max(0, n - len(plan))
                body = page(steps).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def scrapes(n: int):
    """scrape(), ending the watch (as Ctrl-C does) at the n+1-th call: a watch of exactly n scrapes, n - 1 windows,
    however slow the machine."""
    calls = {"n": 0}

    def read(url):
        calls["n"] += 1
        if calls["n"] > n:
            raise KeyboardInterrupt
        return scrape(url)
    return read


def windows_before_alarm(out: str) -> tuple[int, str]:
    """From the CLI's plain output: how many window lines came before the first ALARM line, and that line."""
    n = 0
    for line in out.splitlines():
        if "ALARM" in line:
            return n, line
        n += "τ=" in line and line.startswith("+")
    return -1, ""


@pytest.mark.parametrize("after, kind", [(COLLAPSED, "τ stayed near 1.0"), (HALVED, "under half of its start")])
def test_the_cli_alarms_within_two_windows_of_a_planted_collapse(planted, tmp_path, after, kind):
    healthy = 3
    url = planted([HEALTHY] * healthy + [after] * 20)
    out = io.StringIO()
    cli.run(url, interval=0.02, duration=60, out=out, live=False, json_path=str(tmp_path / "w.json"),
            read=scrapes(healthy + 6))
    n, line = windows_before_alarm(out.getvalue())
    # the alarm is printed as window healthy + k ends, k = 1 or 2: before that window's own line
    assert healthy < n + 1 <= healthy + 2, out.getvalue()
    assert kind in line and "\n" not in line
    data = json.loads((tmp_path / "w.json").read_text())
    assert data["summary"]["alarms"][0]["line"] == line.split(" ", 1)[1]
    assert any(x.startswith("+") and "ALARM" in x for x in out.getvalue().splitlines()[-4:])  # in the summary


def test_no_alarm_on_a_healthy_or_idle_server(planted):
    for plan in ([HEALTHY] * 30, [(0, 0, 0)] * 30, [HEALTHY, (1, 3, 0)] * 15):  # the last: too few drafts to judge
        out = io.StringIO()
        cli.run(planted(plan), interval=0.02, duration=60, out=out, live=False, read=scrapes(12))
        assert "ALARM" not in out.getvalue(), out.getvalue()


def test_a_gauge_only_engine_is_judged_and_its_alarm_ends_when_it_recovers():
    w = Watch()
    for i, tau in enumerate([2.5, 2.5, 1.02, 1.01, 1.0, 2.4, 2.6, 2.6]):  # SGLang: τ only from its accept-length gauge
        w.add(parse(f"# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length {tau}\n"
                    "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n", t=float(i)))
    seen = [alarm(w.series[:k]) for k in range(1, len(w.series) + 1)]
    # a window averages the gauge at its two ends: 2.5, 1.76, 1.015, 1.005, 1.7, 2.5, 2.6
    assert [a.kind if a else None for a in seen] == [None, None, None, "collapsed", None, None, None]


def test_the_tab_shows_the_alarm_within_two_windows(planted):
    healthy = 3
    url = planted([HEALTHY] * healthy + [COLLAPSED] * 10)
    state = tab.watch_start(url, 2, None, "eagle")[0]
    assert state.watch.drafter == "eagle"
    shown = []
    for _ in range(healthy + 2):
        out = tab.watch_tick(state)
        shown.append(html.unescape(out[2]))
    assert not any("ALARM" in v for v in shown[:healthy + 1])
    assert 'id="watch-alarm"' in shown[healthy + 1] and "τ stayed near 1.0" in shown[healthy + 1]
    assert "sv-verdict-bad" in shown[healthy + 1] and out[-1]["alarm"].startswith("ALARM")
