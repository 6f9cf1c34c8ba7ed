"""specviz's own counters under the serving engines' spec_decode names (specviz/serving/export.py): golden events ->
Prometheus text, read back with prometheus_client's parser and with `watch`'s; the app's /metrics route; and
`--metrics-file` on generate and bench."""
from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_plots import TREE
from test_render import FULL, NO_DRAFT, PARTIAL

from specviz.errors import ConfigError
from specviz.metrics import summarize
from specviz.serving import export
from specviz.serving import prometheus as metrics

# the golden events, counted by hand (export.py's definitions):
#   PARTIAL  a chain of 4: kept 2 (positions 0, 1), refused 1, 1 never judged; emits 3
#   FULL     a chain of 2: both kept (positions 0, 1) and the bonus; emits 3
#   NO_DRAFT nothing drafted (no draft); emits 1
#   TREE     5 nodes: the path of depths 0 and 1 kept; emits 3
EVENTS = [PARTIAL, FULL, NO_DRAFT, TREE]
EXPECTED = {"drafts": 3, "draft_tokens": 4 + 2 + 5, "accepted": 2 + 2 + 2, "per_position": {0: 3, 1: 3},
            "generation": 3 + 3 + 1 + 3}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text -> {(sample name, sorted labels): value}, through prometheus_client's own parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def counted(events=EVENTS, method="eagle") -> export.Exporter:
    ex = export.Exporter()
    ex.observe_run(events, method)
    return ex


def test_golden_events_read_back_by_prometheus_client():
    got = samples(counted().text())
    m = (("method", "eagle"),)
    assert got[("specviz:spec_decode_num_drafts_total", m)] == EXPECTED["drafts"]
    assert got[("specviz:spec_decode_num_draft_tokens_total", m)] == EXPECTED["draft_tokens"]
    assert got[("specviz:spec_decode_num_accepted_tokens_total", m)] == EXPECTED["accepted"]
    assert got[("specviz:generation_tokens_total", m)] == EXPECTED["generation"]
    per_pos = {int(dict(labels)["position"]): v for (name, labels), v in got.items()
               if name == "specviz:spec_decode_num_accepted_tokens_per_pos_total"}
    assert per_pos == EXPECTED["per_position"]
    assert got[("specviz:num_requests_running", ())] == 0
    # the names a vLLM dashboard queries, under specviz's prefix
    names = {name for name, _ in got}
    for suffix in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"):
        assert f"specviz:spec_decode_{suffix}_total" in names


def test_methods_are_labelled_apart_and_sum_in_watch():
    ex = counted([PARTIAL], "vanilla")
    ex.observe_run([FULL], "pld")
    got = samples(ex.text())
    assert got[("specviz:spec_decode_num_accepted_tokens_total", (("method", "vanilla"),))] == 2
    assert got[("specviz:spec_decode_num_draft_tokens_total", (("method", "pld"),))] == 2
    snap = metrics.parse(ex.text())  # watch's reader sums the series of one name
    assert snap.engine == "specviz" and snap.speculative
    assert snap.counters["drafts"] == 2 and snap.counters["draft_tokens"] == 6 and snap.counters["accepted_tokens"] == 4


def test_a_watch_of_the_export_gives_vllms_figures_and_specviz_agrees_on_a_chain():
    ex = export.Exporter()
    ex.declare("vanilla")  # an idle run's counters at zero: a scrape finds them
    before = metrics.parse(ex.text(), t=0.0)
    assert before.speculative and before.counters["drafts"] == 0
    chain = [PARTIAL, FULL]
    ex.observe_run(chain, "vanilla")
    watch = metrics.Watch()
    watch.add(before)
    w = watch.add(metrics.parse(ex.text(), t=2.0))
    assert w.drafts == 2 and w.tau == 1 + 4 / 2 and w.acceptance_rate == 4 / 6
    assert w.per_position == [1.0, 1.0]  # both drafts kept positions 0 and 1
    # τ = 1 + accepted / drafts is specviz's τ (tokens per target forward) when every forward drafted
    assert w.tau == summarize("vanilla", chain).tau
    # and the exported draft tokens count the one never judged, which specviz's α leaves out
    assert summarize("vanilla", chain).alpha == 4 / 5 != w.acceptance_rate


def test_running_counts_a_run_in_progress_and_a_stopped_run_ends():
    ex = export.Exporter()

    def running() -> float:
        return samples(ex.text())[("specviz:num_requests_running", ())]

    stream = ex.metered(iter(EVENTS), "eagle")
    next(stream)
    assert running() == 1
    stream.close()  # a Stop mid-run
    assert running() == 0
    assert samples(ex.text())[("specviz:spec_decode_num_drafts_total", (("method", "eagle"),))] == 1
    list(ex.metered(iter(EVENTS), "eagle"))
    assert running() == 0


def test_write_is_the_same_text_and_a_bad_path_is_one_line(tmp_path):
    ex = counted()
    path = tmp_path / "sub" / "specviz.prom"
    ex.write(path)
    assert path.read_text() == ex.text()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"metrics-file='.*file/m.prom' cannot be written"):
        ex.write(blocker / "m.prom")


def test_the_metrics_route_serves_the_apps_counters():
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    before = samples(export.APP.text()).get(("specviz:spec_decode_num_drafts_total", (("method", "route-test"),)), 0)
    export.APP.observe(PARTIAL, "route-test")
    response = TestClient(Starlette(routes=[export.metrics_route()])).get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert samples(response.text)[("specviz:spec_decode_num_drafts_total", (("method", "route-test"),))] == before + 1


def test_an_unwritable_metrics_file_is_refused_before_any_model_loads(tmp_path, capsys):
    from specviz.cli.main import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["generate", "--prompt", "hi", "--metrics-file", str(blocker / "m.prom")]) == 2
    err = capsys.readouterr().err
    assert "cannot be written" in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.integration
def test_generate_and_bench_write_their_counters(target, tmp_path, capsys):
    """The real target: generate's file counts the tokens it printed; bench's the tokens of its JSON rows."""
    from specviz.cli.main import main

    prom = tmp_path / "generate.prom"
    assert main(["generate", "--prompt", "Repeat: one two three, one two three, one two three.", "--method", "pld",
                 "--max-new-tokens", "24", "--metrics-file", str(prom)]) == 0
    out = capsys.readouterr().out
    printed = int(out.split(" tokens in ")[0].split()[-1])
    got = samples(prom.read_text())
    m = (("method", "pld"),)
    assert got[("specviz:generation_tokens_total", m)] == printed
    drafts, accepted = (got[(f"specviz:spec_decode_num_{k}_total", m)] for k in ("drafts", "accepted_tokens"))
    assert drafts > 0 and 0 < accepted <= got[("specviz:spec_decode_num_draft_tokens_total", m)]
    per_pos = [v for (name, _), v in got.items() if name.endswith("_per_pos_total")]
    assert sum(per_pos) == accepted and max(per_pos) <= drafts

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "category": "qa", "prompt": "What is the boiling point of water?"}\n'
                       '{"id": 2, "category": "writing", "prompt": "Repeat: red, green, red, green, red."}\n')
    prom, report = tmp_path / "bench.prom", tmp_path / "bench.json"
    assert main(["bench", "--prompts", str(prompts), "--method", "pld", "eagle:2", "--max-new-tokens", "16",
                 "--no-ar-reference", "--json", str(report), "--metrics-file", str(prom)]) == 0
    rows = json.loads(report.read_text())["rows"]
    got = samples(prom.read_text())
    methods = list(dict.fromkeys(r["method"] for r in rows))  # eagle:2 named with the branches it raced here
    assert len(methods) == 2 and methods[0] == "pld" and methods[1].startswith("eagle:2")
    for method in methods:
        m = (("method", method),)
        assert got[("specviz:generation_tokens_total", m)] == sum(r["new_tokens"] for r in rows
                                                                   if r["method"] == method)
        assert got[("specviz:spec_decode_num_drafts_total", m)] > 0
