"""Serving engines' /metrics -> speculative figures (specviz/serving): parsing, windows, resets, the verdict, and one
line for every kind of bad input. vLLM, SGLang and TensorRT-LLM cannot run on this machine: their expositions
below are written by hand from their code and docs (vLLM's vllm/v1/spec_decode/metrics.py and SGLang's
python/sglang/srt/metrics/collector.py: names, types and labels as those files declare them; TensorRT-LLM: the metric
names its docs list), not captured from a live server. llama.cpp's is exercised live in tests/test_llama_server.py."""
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specviz import metrics as leviathan
from specviz.cli.main import main
from specviz.serving import probe, watch
from specviz.serving.alarm import Alarm
from specviz.serving.prometheus import (
    ServerError,
    Unreachable,
    Watch,
    metrics_url,
    no_speculation,
    parse,
    scrape,
    window,
)
from specviz.serving.server import free_port


def vllm_page(drafts, draft_tokens, accepted, per_pos, running=1.0):
    """vLLM v1's exposition (hand-written from its code): one series per engine (two engines here, each holding half
    of every count), `_total` and `_created` samples, the per-position counter labelled `position`."""
    lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge"]
    for e in ("0", "1"):
        lines.append(f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {running / 2}')
    for name, value in (("spec_decode_num_drafts", drafts), ("spec_decode_num_draft_tokens", draft_tokens),
                        ("spec_decode_num_accepted_tokens", accepted)):
        lines += [f"# HELP vllm:{name} Number of spec decoding {name}.", f"# TYPE vllm:{name} counter"]
        for e in ("0", "1"):
            lines.append(f'vllm:{name}_total{{engine="{e}",model_name="m"}} {value / 2}')
            lines.append(f'vllm:{name}_created{{engine="{e}",model_name="m"}} 1.7e9')
    lines += ["# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens per draft position.",
              "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"]
    for i, v in enumerate(per_pos):
        for e in ("0", "1"):
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="m",'
                         f'position="{i}"}} {v / 2}')
    lines += ["# HELP vllm:generation_tokens Number of generation tokens processed.",
              "# TYPE vllm:generation_tokens counter", 'vllm:generation_tokens_total{engine="0",model_name="m"} 5000']
    return "\n".join(lines) + "\n"


SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="m",tp_rank="0",dp_rank="0"}} {running}
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{model_name="m",tp_rank="0",dp_rank="0"}} {length}
# HELP sglang:spec_accept_rate The average acceptance rate of speculative decoding.
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{{model_name="m",tp_rank="0",dp_rank="0"}} {rate}
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="m"}} 900
"""

TRTLLM = """# HELP trtllm_spec_decode_num_draft_tokens_total Total draft tokens in speculative decoding.
# TYPE trtllm_spec_decode_num_draft_tokens_total counter
trtllm_spec_decode_num_draft_tokens_total{{engine_type="trtllm",model_name="m"}} {drafted}
# HELP trtllm_spec_decode_num_accepted_tokens_total Total accepted tokens in speculative decoding.
# TYPE trtllm_spec_decode_num_accepted_tokens_total counter
trtllm_spec_decode_num_accepted_tokens_total{{engine_type="trtllm",model_name="m"}} {accepted}
# HELP trtllm_spec_decode_acceptance_length Acceptance length.
# TYPE trtllm_spec_decode_acceptance_length gauge
trtllm_spec_decode_acceptance_length{{engine_type="trtllm",model_name="m"}} {length}
"""

SPECVIZ = """# TYPE specviz:spec_decode_num_drafts_total counter
specviz:spec_decode_num_drafts_total 40
# TYPE specviz:spec_decode_num_draft_tokens_total counter
specviz:spec_decode_num_draft_tokens_total 160
# TYPE specviz:spec_decode_num_accepted_tokens_total counter
specviz:spec_decode_num_accepted_tokens_total 64
# TYPE specviz:spec_decode_num_accepted_tokens_per_pos_total counter
specviz:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 30
specviz:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 20
"""

PLAIN = """# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
"""


def test_vllm_sums_engines_and_skips_created():
    snap = parse(vllm_page(10, 40, 18, [8, 6, 3, 1], running=3), t=1.0)
    assert snap.engine == "vllm"
    assert snap.counters == {"drafts": 10, "draft_tokens": 40, "accepted_tokens": 18, "generated_tokens": 5000}
    assert snap.per_position == {0: 8, 1: 6, 2: 3, 3: 1}
    assert snap.gauges == {"requests_running": 3}  # summed over the engines' series, as the counters
    assert snap.speculative
    assert "vllm:spec_decode_num_drafts_total" in snap.names
    assert not any(n.endswith("_created") for n in snap.names)


def test_window_follows_vllm_definitions():
    a = parse(vllm_page(10, 40, 18, [8, 6, 3, 1], running=2), t=100.0)
    b = parse(vllm_page(30, 120, 54, [24, 16, 10, 4], running=4), t=104.0)
    w = window(a, b)
    assert (w.drafts, w.draft_tokens, w.accepted_tokens) == (20, 80, 36)
    assert w.tau == pytest.approx(1 + 36 / 20)
    assert w.acceptance_rate == pytest.approx(36 / 80)
    assert w.per_position == pytest.approx([16 / 20, 10 / 20, 7 / 20, 3 / 20])
    assert w.requests_running == pytest.approx((2 + 4) / 2)  # the gauge averaged over the window, not differenced
    assert w.seconds == 4.0 and not w.reset


def test_reset_restarts_from_the_new_values():
    a = parse(vllm_page(500, 2000, 900, [400, 300, 150, 50]), t=0.0)
    b = parse(vllm_page(10, 40, 12, [6, 4, 2, 0]), t=2.0)
    w = window(a, b)
    assert w.reset
    assert (w.drafts, w.accepted_tokens) == (10, 12)
    assert w.tau == pytest.approx(2.2)


def test_watch_summary_is_exact_over_windows_and_predicts_with_leviathan():
    pages = [vllm_page(0, 0, 0, [0, 0, 0, 0]), vllm_page(10, 40, 20, [9, 6, 4, 1]),
             vllm_page(40, 160, 50, [33, 12, 4, 1])]
    w = Watch(cost_ratio=0.05)
    assert w.add(parse(pages[0], t=0.0)) is None
    for t, page in ((2.0, pages[1]), (4.0, pages[2])):
        w.add(parse(page, t=t))
    s = w.summary()
    assert (s["drafts"], s["draft_tokens"], s["accepted_tokens"]) == (40, 160, 50)
    assert s["tau"] == pytest.approx(1 + 50 / 40) and s["acceptance_rate"] == pytest.approx(50 / 160)
    assert s["per_position"] == pytest.approx([33 / 40, 12 / 40, 4 / 40, 1 / 40])
    assert s["per_position_conditional"] == pytest.approx([33 / 40, 12 / 33, 4 / 12, 1 / 4])
    assert s["gamma"] == 4 and s["gamma_from"] == "positions exported"
    # a new user's pass: at the engine's rate (50/160: every drafted token) Leviathan's τ is 1.45, below the measured
    # 2.25; the prediction takes the per-token α whose chain of 4 gives the measured τ
    assert leviathan.expected_tokens_per_step(s["alpha_per_token"], 4) == pytest.approx(s["tau"])
    assert w.predicted_speedup() == pytest.approx(s["tau"] / (1 + 4 * 0.05))
    assert (leviathan.alpha_for_tau(1.0, 3), leviathan.alpha_for_tau(4.0, 3), leviathan.alpha_for_tau(9.0, 3)) == (
        0.0, 1.0, 1.0)
    assert s["draft_tokens_per_s"] == pytest.approx(160 / 4)
    assert w.verdict().startswith("healthy") and "α_i falls by position" in w.verdict()


def test_verdicts_idle_collapsed_and_rising():
    idle = Watch()
    idle.add(parse(vllm_page(5, 20, 2, [2, 0, 0, 0]), t=0.0))
    idle.add(parse(vllm_page(5, 20, 2, [2, 0, 0, 0]), t=5.0))
    assert idle.verdict().startswith("idle")
    collapsed = Watch()
    collapsed.add(parse(vllm_page(0, 0, 0, [0, 0, 0, 0]), t=0.0))
    collapsed.add(parse(vllm_page(100, 400, 3, [3, 0, 0, 0]), t=5.0))
    assert collapsed.verdict().startswith("collapsed: τ=1.03 < 1.1")
    few = Watch()  # a new user's pass: a watch that caught the end of one request said "collapsed" over 4 drafts
    few.add(parse(vllm_page(0, 0, 0, [0, 0, 0, 0]), t=0.0))
    few.add(parse(vllm_page(4, 16, 0, [0, 0, 0, 0]), t=5.0))
    assert few.verdict().startswith("few drafts: τ=1.00, draft acceptance 0.00 over 4 drafts, too few to judge")
    rising = Watch(drafter="ngram")  # an n-gram copy: once the first position is kept, later ones nearly always are
    rising.add(parse(vllm_page(0, 0, 0, [0, 0, 0, 0]), t=0.0))
    rising.add(parse(vllm_page(100, 400, 90, [40, 30, 20, 0]), t=5.0))
    assert "α_i is not monotone by position (0.40 0.75 0.67 0.00): not monotone for an n-gram copy" in rising.verdict()
    rising.add(parse(vllm_page(200, 800, 242, [80, 72, 60, 30]), t=10.0))
    assert "α_i is not monotone by position (0.40 0.90 0.83 0.50)" in rising.verdict()
    sparse = Watch()  # 103 drafts; positions 4-6 reached by 14, 11 and 8 drafts: too few to read a trend from
    sparse.add(parse(vllm_page(0, 0, 0, [0] * 6), t=0.0))
    sparse.add(parse(vllm_page(103, 618, 150, [70, 35, 15, 11, 10, 9]), t=5.0))
    assert "α_i falls by position (0.68 0.50 0.43)" in sparse.verdict()


def test_sglang_gauges_give_tau_and_rate_only_while_busy():
    busy = [parse(SGLANG.format(running=r, length=L, rate=a), t=t)
            for r, L, a, t in ((2, 2.6, 0.5, 0.0), (4, 3.0, 0.7, 2.0))]
    assert busy[0].engine == "sglang" and busy[0].speculative and "drafts" not in busy[0].counters
    w = window(*busy)
    assert w.tau == pytest.approx(2.8) and w.acceptance_rate == pytest.approx(0.6)
    idle = [parse(SGLANG.format(running=0, length=2.6, rate=0.5), t=t) for t in (0.0, 2.0)]
    assert window(*idle).tau is None  # an idle server's gauges hold stale values


def test_trtllm_counters_and_acceptance_length_gauge():
    a = parse(TRTLLM.format(drafted=100, accepted=40, length=2.0), t=0.0)
    b = parse(TRTLLM.format(drafted=300, accepted=160, length=3.0), t=1.0)
    assert a.engine == "trtllm" and a.counters == {"draft_tokens": 100, "accepted_tokens": 40}
    w = window(a, b)
    assert w.acceptance_rate == pytest.approx(120 / 200)
    assert w.tau == pytest.approx(2.5)  # no drafts counter: from the gauge, averaged


def test_specviz_own_names_are_detected():
    snap = parse(SPECVIZ, t=0.0)
    assert snap.engine == "specviz"
    assert snap.counters == {"drafts": 40, "draft_tokens": 160, "accepted_tokens": 64}
    assert snap.per_position == {0: 30, 1: 20}


@pytest.mark.parametrize("text", ["<!doctype html><html><body>hello</body></html>", '{"error": "nope"}', "",
                                  "# only a comment\n"])
def test_not_prometheus_is_one_line(text):
    with pytest.raises(ServerError) as info:
        parse(text)
    assert "\n" not in str(info.value) and ("not Prometheus" in str(info.value) or "no Prometheus" in str(info.value))


def test_no_speculative_counters():
    snap = parse(PLAIN)
    assert snap.engine == "llamacpp" and not snap.speculative
    line = no_speculation("http://127.0.0.1:8080", snap)
    assert "exports no speculative-decoding counters" in line and "\n" not in line


def test_urls():
    assert metrics_url("http://h:1") == "http://h:1/metrics"
    assert metrics_url("http://h:1/metrics/") == "http://h:1/metrics"
    assert metrics_url("http://h:1/v1") == "http://h:1/metrics"
    with pytest.raises(ServerError, match="is not an http"):
        metrics_url("h:1")


class Handler(BaseHTTPRequestHandler):
    """A local page server for the HTTP failure cases, chosen by path."""

    def log_message(self, *args):
        pass

    def _send(self, status, body, ctype="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/slow"):
            time.sleep(1.5)
            self._send(200, PLAIN.encode())
        elif self.path.startswith("/big"):
            self._send(200, b"x 1\n" * 10000)
        elif self.path.startswith("/html"):
            self._send(200, b"<!doctype html><html><body>not metrics</body></html>", "text/html")
        elif self.path.startswith("/plain"):
            self._send(200, PLAIN.encode())
        else:
            self._send(404, b"not found")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._send(500, json.dumps({"error": {"message": "model exploded\nsecond line"}}).encode(), "application/json")


class Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the /slow client has hung up: nothing to report


@pytest.fixture(scope="module")
def pages():
    server = Quiet(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_http_failures_are_one_line(pages):
    cases = [(f"{pages}/slow", dict(timeout=0.3), Unreachable, "did not answer within 0.3 s"),
             (f"{pages}/big", dict(max_bytes=1000), ServerError, "over the cap"),
             (f"{pages}/html", {}, ServerError, "is not Prometheus text"),
             (f"{pages}/nothing", {}, ServerError, "answered HTTP 404: start the server with its metrics on"),
             (f"http://127.0.0.1:{free_port()}", {}, Unreachable, "cannot connect to")]
    for url, kwargs, kind, message in cases:
        with pytest.raises(kind) as info:
            scrape(url, **kwargs)
        assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_api_error_is_one_line(pages):
    with pytest.raises(ServerError) as info:
        probe.chat(pages, "hi", 8, 0.0, 0, 5.0)
    assert str(info.value) == f"{pages}/v1/chat/completions answered HTTP 500: model exploded"


@pytest.mark.parametrize("argv,message", [
    (["watch", "127.0.0.1:8080"], "url='127.0.0.1:8080' is not an http(s) URL"),
    (["watch", "http://127.0.0.1:{port}", "--duration", "1"], "cannot connect to http://127.0.0.1:{port}/metrics"),
    (["watch", "{pages}/plain"], "exports no speculative-decoding counters"),
    (["watch", "{pages}/html"], "is not Prometheus text"),
    (["watch", "http://h:1", "--interval", "0"], "interval=0 is out of range"),
    (["probe", "http://127.0.0.1:{port}", "--prompts", "{prompts}"], "cannot connect to http://127.0.0.1:{port}"),
    (["probe", "{pages}", "--prompts", "{prompts}"], "answered HTTP 500: model exploded"),
    (["probe", "{pages}", "--prompts", "/nope.jsonl"], "prompt file '/nope.jsonl' does not exist"),
    (["probe", "{pages}", "--prompts", "{prompts}", "--temperature", "-1"], "temperature=-1 is out of range"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, tmp_path, pages, argv, message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "category": "qa", "prompt": "hi"}\n')
    fill = dict(port=free_port(), pages=pages, prompts=prompts)
    code = main([a.format(**fill) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message.format(**fill) in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_watch_keeps_its_series_through_a_failure_and_a_restart(tmp_path):
    script = [vllm_page(0, 0, 0, [0, 0]), vllm_page(10, 20, 12, [8, 4]), ServerError("http://x/metrics: boom"),
              vllm_page(30, 60, 30, [20, 10]), vllm_page(4, 8, 6, [4, 2]), vllm_page(14, 28, 16, [10, 6])]
    clock = iter(range(100))

    def read(url):
        if not script:
            raise KeyboardInterrupt  # the user stops the watch
        item = script.pop(0)
        if isinstance(item, Exception):
            raise item
        return parse(item, t=float(next(clock)))

    out = io.StringIO()
    w = watch.run("http://x", interval=0.001, json_path=str(tmp_path / "w.json"), out=out, live=False, read=read)
    text = out.getvalue()
    assert "scrape failed: http://x/metrics: boom (the series so far is kept)" in text
    assert "the server restarted" in text
    assert [x.reset for x in w.series] == [False, False, True, False]
    data = json.loads((tmp_path / "w.json").read_text())
    s = data["summary"]
    # 10 + 20 drafts before the restart, 4 + 10 after it
    assert (s["drafts"], s["draft_tokens"], s["accepted_tokens"]) == (44, 88, 46)
    assert s["resets"] == 1 and len(s["failed_scrapes"]) == 1 and len(data["series"]) == 4
    assert {"drafts", "draft_tokens", "accepted_tokens", "acceptance_rate", "tau", "per_position"} <= set(s)


def test_live_view_draws_the_verdict_and_positions():
    from rich.console import Console

    w = Watch()
    w.add(parse(vllm_page(0, 0, 0, [0, 0, 0, 0]), t=0.0))
    last = w.add(parse(vllm_page(10, 40, 20, [9, 6, 4, 1]), t=2.0))
    view = watch.LiveView.__new__(watch.LiveView)
    view.url, view.since, view.notes = "http://x/metrics", 0.0, ["+2.0s scrape failed: boom"]
    view.alarm = None
    out = io.StringIO()
    Console(file=out, width=120).print(view._render(w, last))
    text = out.getvalue()
    assert "few drafts: τ=3.00" in text and "acceptance by draft position" in text and "scrape failed: boom" in text
    assert "ALARM" not in text
    view.raise_alarm(Alarm("collapsed", "ALARM: τ stayed near 1.0", 2.0), "")
    out = io.StringIO()
    Console(file=out, width=120).print(view._render(w, last))
    assert out.getvalue().index("ALARM: τ stayed near 1.0") < out.getvalue().index("few drafts")  # on top


def test_probe_reads_llamacpp_and_sglang_responses():
    llama = {"model": "m", "choices": [{"message": {"content": "abc"}, "finish_reason": "length"}],
             "usage": {"completion_tokens": 40},
             "timings": {"draft_n": 36, "draft_n_accepted": 18, "predicted_n": 40, "predicted_per_second": 50.0}}
    f = probe.figures(llama)
    assert (f["draft_tokens"], f["accepted_tokens"], f["source"], f["server_tok_per_s"]) == (36, 18, "timings", 50.0)
    sglang = {"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 30},
              "meta_info": {"spec_verify_ct": 12}}
    f = probe.figures(sglang)
    assert f["verify_steps"] == 12 and f["accepted_tokens"] == 18 and f["source"] == "meta_info"


def test_divergence_and_reference_gap():
    assert probe.divergence("same", "same") is None
    d = probe.divergence("The sky is blue because", "The sky is bright because")
    assert d["index"] == 12 and d["context"] == "The sky is b" and d["spec"].startswith("lue")
    tokens = [{"token": "The", "top_logprobs": [{"logprob": -0.1}, {"logprob": -3.0}]},
              {"token": " sky is b", "top_logprobs": [{"logprob": -0.5}, {"logprob": -0.5005}]}]
    assert probe._gap_at(tokens, 12) is None  # past the tokens given
    assert probe._gap_at(tokens, 5) == pytest.approx(0.0005)
    assert probe.divergence("abc", "abcdef")["index"] == 3  # one stopped early
