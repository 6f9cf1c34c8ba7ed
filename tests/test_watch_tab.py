"""The "Watch a server" tab: which URLs a public deployment may fetch (serving/access.py), its panels, its handlers
against a real local HTTP server serving specviz's own export (bad pages, a restart, public mode), and the tab
through a real Gradio client watching the running app's own /metrics while a race runs."""
from __future__ import annotations

import html
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import plotly.graph_objects as go
import pytest
from test_plots import TREE
from test_render import FULL, PARTIAL

from specviz.serving import access, export
from specviz.serving.access import Access, AccessError
from specviz.serving.prometheus import MIN_SUPPORT
from specviz.ui import watch as tab
from specviz.ui import watch_plots

PUBLIC = Access(public=True, hosts=("metrics.example.org", "127.0.0.1", "localhost", "::1"))


def resolving_to(*addresses):
    return lambda host, port: list(addresses)


# ── which URLs ─────────────────────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://10.0.0.5/metrics", "https://[::1]:9000",
                                 "http://localhost:7860/"])
def test_outside_public_mode_any_http_url_is_allowed(url):
    assert access.check(url, Access(public=False)) == url


@pytest.mark.parametrize("url, needle", [
    ("", "the server URL is empty"),
    ("ftp://example.org/metrics", "is not an http(s) URL"),
    ("http://", "is not an http(s) URL"),
    ("example.org:8000", "is not an http(s) URL"),
    ("http://user:secret@example.org", "carries credentials"),
    ("http://example.org:99999", "is not a URL"),
])
def test_malformed_urls_are_one_line_in_any_mode(url, needle):
    for rules in (Access(public=False), PUBLIC):
        with pytest.raises(AccessError) as info:
            access.check(url, rules)
        assert needle in str(info.value) and "\n" not in str(info.value)


def test_public_mode_allows_an_allow_listed_host_with_public_addresses_only():
    url = "https://metrics.example.org/metrics"
    assert access.check(url, PUBLIC, resolving_to("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946")) == url
    with pytest.raises(AccessError, match="'vllm.example.com' is not on this deployment's allow-list: allowed hosts "
                                          "are metrics.example.org, 127.0.0.1"):
        access.check("http://vllm.example.com:8000", PUBLIC, resolving_to("93.184.216.34"))
    with pytest.raises(AccessError, match=r"allowed hosts are none \(the operator sets SPECVIZ_WATCH_HOSTS\)"):
        access.check(url, Access(public=True), resolving_to("93.184.216.34"))


@pytest.mark.parametrize("address, kind", [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.20", "private"), ("fd12:3456::1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1%eth0", "link-local"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.0.0.1", "private"), ("2002:a00:1::", "private"),
    ("64:ff9b::7f00:1", "loopback"), ("100.64.0.1", "not a public address"), ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
])
def test_public_mode_refuses_names_resolving_to_non_public_addresses(address, kind):
    with pytest.raises(AccessError) as info:
        access.check("http://metrics.example.org:8000", PUBLIC, resolving_to("93.184.216.34", address))
    message = str(info.value)
    assert f"resolves to {address}" in message and kind in message and "\n" not in message


@pytest.mark.parametrize("url", ["http://127.0.0.1:7860", "http://localhost:7860", "http://[::1]:7860"])
def test_public_mode_refuses_loopback_even_when_allow_listed(url):
    """The real resolver: 'localhost' and address literals resolve without a network."""
    with pytest.raises(AccessError, match="loopback"):
        access.check(url, PUBLIC)


def test_an_unresolvable_host_is_one_line():
    def fail(host, port):
        raise OSError("Name or service not known")

    with pytest.raises(AccessError, match="'metrics.example.org' does not resolve"):
        access.check("http://metrics.example.org", PUBLIC, fail)


def test_the_rules_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("SPECVIZ_PUBLIC", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.setenv("SPECVIZ_WATCH_HOSTS", " Metrics.Example.org , [::1],")
    assert Access.from_env() == Access(public=False, hosts=("metrics.example.org", "::1"))
    monkeypatch.setenv("SPACE_ID", "someone/specviz")  # a Hugging Face Space is public by default
    assert Access.from_env().public
    monkeypatch.setenv("SPECVIZ_PUBLIC", "0")
    assert not Access.from_env().public


# ── the panels ─────────────────────────────────────────────────────────────────────────────────────────────────────

def test_every_watch_figure_passes_plotlys_validation(served):
    url, page = served
    ex = export.Exporter()
    ex.declare("eagle")
    page["text"] = ex.text()
    state = tab.watch_start(url, 2)[0]
    for events in ([PARTIAL, FULL], [TREE], []):
        ex.observe_run(events, "eagle")
        page["text"] = ex.text()
        tab.watch_tick(state)
    assert len(state.watch.series) == 3
    for fig in (*tab.figures(state), *tab.figures(None)):
        go.Figure(fig.to_dict())  # built unvalidated for speed: check the names and values here
    acceptance, tau, position, rate = tab.figures(state)
    assert list(acceptance.data[0].y) == [4 / 6, 2 / 5, None]  # per window; the last window drafted nothing
    assert list(tau.data[0].y) == [3.0, 3.0, None]
    assert list(position.data[0].y) == [1.0, 1.0] and list(position.data[1].y) == [1.0, 1.0]
    assert len(rate.data) == 3 and len(watch_plots.watch_rate_figure([], 0.0).data[0].x) == 0


# ── the handlers against a real HTTP server ──────────────────────────────────────────────────────────────────────

@pytest.fixture
def served():
    """A local HTTP server answering every GET with page["text"] and page["status"]."""
    page = {"text": "", "status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = page["text"].encode()
            self.send_response(page["status"])
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client stopped reading an oversized page
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", page
    server.shutdown()
    server.server_close()


def skipped(value) -> bool:
    return isinstance(value, dict) and value == {"__type__": "update"}


def status_of(out) -> str:
    """The status line's text: a tick's outputs start with the state, a start's with the state and the timer."""
    return html.unescape(out[1] if len(out) == 9 else out[2])


def test_a_watch_keeps_its_series_through_bad_pages_and_says_so_in_one_line(served):
    url, page = served
    ex = export.Exporter()
    ex.declare("vanilla")
    page["text"] = ex.text()
    out = tab.watch_start(url, 2)
    state = out[0]
    assert "Watching" in status_of(out) and out[1].active and out[1].value == 2
    ex.observe_run([PARTIAL, FULL], "vanilla")
    page["text"] = ex.text()
    out = tab.watch_tick(state)
    assert len(state.watch.series) == 1 and out[-1]["summary"]["tau"] == 3.0
    assert "few drafts" in out[2] and 'sv-verdict-idle' in out[2]  # 2 drafts: too few to call healthy

    bad = [("<html><body>not metrics</body></html>", 200, "Prometheus"),
           ("# TYPE up gauge\nup 1\n", 200, "exports no speculative-decoding counters"),
           ("gone", 404, "answered HTTP 404"),
           ("x" * (9 << 20), 200, "over the cap")]
    for text, status, needle in bad:
        page["text"], page["status"] = text, status
        out = tab.watch_tick(state)
        line = status_of(out)
        assert needle in line and "⚠" in line and "its series is kept (1 windows)" in line, line
        assert "Traceback" not in line and "\n" not in line
        assert all(skipped(v) for v in out[2:8])  # the panels keep the series
        assert out[-1]["error"] and len(state.watch.series) == 1
    assert len(state.watch.failures) == len(bad)

    restarted = export.Exporter()  # a server restart: its counters start again from zero
    restarted.observe_run([FULL], "vanilla")
    page["text"], page["status"] = restarted.text(), 200
    out = tab.watch_tick(state)
    assert "restarted" in status_of(out) and state.watch.series[-1].reset and state.watch.series[-1].tau == 3.0
    assert out[-1]["summary"]["resets"] == 1 and out[-1]["error"] is None

    out = tab.watch_stop(state)
    assert "Stopped" in out[2] and not out[1].active and not state.running
    assert all(skipped(v) for v in tab.watch_tick(state))  # a tick already queued does nothing


def test_bad_starts_are_one_line_and_leave_a_running_watch_alone(served, monkeypatch):
    url, page = served
    ex = export.Exporter()
    ex.declare("pld")
    page["text"] = ex.text()
    running = tab.watch_start(url, 2)[0]
    cases = [(url, 0.2, "interval=0.2 s is out of range: use 1..60 seconds"),
             ("ftp://nowhere", 2, "is not an http(s) URL"),
             ("http://127.0.0.1:9", 2, "cannot connect to http://127.0.0.1:9/metrics")]
    for bad_url, interval, needle in cases:
        out = tab.watch_start(bad_url, interval, running)
        assert skipped(out[0]) and skipped(out[1])  # the watch in progress and its timer go on
        assert needle in status_of(out) and "The watch in progress goes on." in status_of(out), out[2]
    monkeypatch.setenv("SPECVIZ_PUBLIC", "1")
    monkeypatch.delenv("SPECVIZ_WATCH_HOSTS", raising=False)
    out = tab.watch_start(url, 2)
    assert "'127.0.0.1' is not on this deployment's allow-list" in status_of(out)
    monkeypatch.setenv("SPECVIZ_WATCH_HOSTS", "127.0.0.1")
    assert "resolves to 127.0.0.1, a loopback address" in status_of(tab.watch_start(url, 2))
    out = tab.watch_tick(running)  # and every scrape checks again
    assert "loopback" in status_of(out) and len(running.watch.series) == 0


# ── the tab through a real Gradio client, watching the app's own /metrics ──────────────────────────────────────────

def test_the_tab_watches_the_app_itself_while_a_race_runs(app_url):
    import httpx
    from gradio_client import Client

    page = httpx.get(app_url + "metrics", timeout=30)
    assert page.status_code == 200 and "specviz:spec_decode_num_drafts_total" in page.text

    watcher, racer = Client(app_url, verbose=False), Client(app_url, verbose=False)
    start = watcher.predict(url=app_url, interval=1, api_name="/watch_start")
    assert "Watching" in str(start) and start[-1]["summary"]["engine"] == "specviz"
    job = racer.submit(prompt="Repeat exactly: red apple, green pear, red apple, green pear.", max_new_tokens=48,
                       api_name="/race")
    during = []
    while not job.done():  # ticks while the race runs: the scrape has its own queue, beside the device's
        during.append(watcher.predict(api_name="/watch_tick")[-1])
    race = job.result()
    final = watcher.predict(api_name="/watch_tick")[-1]
    s, spec = final["summary"], race["summary"]["spec"]
    assert s["engine"] == "specviz" and final["error"] is None and during
    # the watch saw exactly this race: its tokens and kept drafts
    assert s["generated_tokens"] == spec["new_tokens"] and s["accepted_tokens"] == spec["accepted"] > 0
    assert 0 < s["drafts"] <= spec["steps"] and s["tau"] == pytest.approx(1 + spec["accepted"] / s["drafts"])
    assert s["per_position"] and s["per_position"][0] > 0
    assert s["verdict"].startswith("healthy" if s["drafts"] >= MIN_SUPPORT else "few drafts"), s["verdict"]
    assert "Stopped watching" in str(watcher.predict(api_name="/watch_stop"))
