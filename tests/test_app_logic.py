"""The app's handler logic without a server: config from form values, the throttle, the summary and the fold."""
from __future__ import annotations

import pytest
from test_render import AR, FULL, NO_DRAFT, PARTIAL

from specviz.config import DecodeConfig
from specviz.errors import ConfigError
from specviz.events import Verdict
from specviz.metrics import compare
from specviz.ui import logic, race_html, race_views


def test_form_defaults_come_from_decode_config():
    cfg = logic.make_config()
    assert cfg == DecodeConfig()
    assert logic.make_config("pld", "auto", seed=None).gamma == "auto"


@pytest.mark.parametrize("kwargs, needle", [({"method": "ar"}, "speculative method"), ({"gamma": "17"}, "gamma"),
                                            ({"temperature": -1}, "temperature"), ({"max_new_tokens": 0}, "max_new")])
def test_bad_form_values_raise_one_line_config_errors(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        logic.make_config(**kwargs)


def test_throttle_passes_first_phase_changes_at_most_one_per_interval_and_the_last():
    times = iter([0.0, 0.1, 0.2, 0.3, 0.36, 0.4, 0.9, 0.95])
    items = [("a", 0), ("b", 1), ("b", 2), ("b", 3), ("b", 4), ("b", 5), ("b", 6), ("b", 7)]
    out = list(race_views.throttle(items, 0.25, key=lambda x: x[0], now=lambda: next(times)))
    # a: first; b@0.1: phase change; b@0.36 is the first >= 0.25 s later; b@0.9 next; the final b@0.95
    assert [i for _, i in out] == [0, 1, 4, 6, 7]


def test_throttle_never_repeats_the_final_item():
    assert list(race_views.throttle([1, 2], 10.0, now=lambda: 0.0)) == [1, 2]
    assert list(race_views.throttle([1], 10.0, now=lambda: 0.0)) == [1]
    assert list(race_views.throttle([], 10.0)) == []


def snapshot(ar, spec, cfg=None):
    snap = logic.RaceSnapshot(cfg or DecodeConfig(method="vanilla"), "int8", phase="done")
    for name, events in (("ar", ar), ("spec", spec)):
        lane = snap.lanes[name]
        lane.events = list(events)
        lane.clock = sum(e.seconds for e in events)
        lane.done = True
    snap.comparison = compare(ar, spec, snap.cfg.method, snap.cfg.greedy)
    return snap


def test_summary_labels_tau_and_shows_the_prediction_beside_the_measured_speedup():
    out = race_html.summary_html(snapshot(AR, [PARTIAL]))
    assert race_html.TAU_LABEL in out
    for label in ("speedup (measured)", "predicted speedup", "acceptance rate α", "cost ratio c"):
        assert f'data-metric="{label}"' in out
    assert "Leviathan" in out


def test_summary_badge_names_the_first_divergence_with_both_tokens():
    out = race_html.summary_html(snapshot(AR, [PARTIAL]))  # AR: "The", " sky"; spec: "The", " sky", " looks"
    assert "differs from plain decoding at token 2" in out and "&#x27; looks&#x27;" in out
    same = race_html.summary_html(snapshot(AR, [StepEventSlice.first_two()]))
    assert "identical to plain decoding" in same
    sampled = race_html.summary_html(snapshot(AR, [PARTIAL], DecodeConfig(temperature=0.7)))
    assert "sampling" in sampled and "identical" not in sampled


class StepEventSlice:
    @staticmethod
    def first_two():
        from dataclasses import replace
        return replace(PARTIAL, emitted=PARTIAL.emitted[:2], finish_reason="length")


def test_panes_show_live_counters_and_state():
    snap = snapshot(AR, [PARTIAL, FULL, NO_DRAFT])
    view = race_views.view_of(snap)
    assert 'data-state="done"' in view.pane_spec and "Speculative (vanilla)" in view.pane_spec
    assert "<b>7</b> tokens" in view.pane_spec and "<b>0.07</b> s compute" in view.pane_spec
    assert "Plain autoregressive" in view.pane_ar and 'data-verdict="plain"' in view.pane_ar
    assert [len(f.data) >= 1 for f in (view.alpha, view.speed, view.accept, view.tree)] == [True] * 4


def test_the_api_result_is_a_fold_over_the_stream(tiny_target):
    cfg = DecodeConfig(method="pld", max_new_tokens=12)
    prompt = "5 6 7 8 5 6 7 8 5 6 7"
    phases = [s.phase for s in logic.race_stream(prompt, cfg, target=tiny_target)]
    assert phases[0] == "loading" and phases[-1] == "done" and set(phases[1:-1]) == {"running"}
    result = logic.race_result(prompt, cfg, target=tiny_target)
    assert result["ar_text"] and result["spec_text"] == result["ar_text"]
    assert result["summary"]["identical"] is True and result["summary"]["spec"]["method"] == "pld"


def test_live_views_redraw_plots_about_once_a_second_and_in_full_at_the_end():
    cfg = DecodeConfig()
    phases = ["loading"] + ["running"] * 6 + ["done"]
    times = [0.0, 0.0, 0.1, 0.3, 0.6, 0.9, 1.2, 1.3]
    current = [0.0]

    def feed():
        for t, phase in zip(times, phases):
            current[0] = t
            yield logic.RaceSnapshot(cfg, "int8", phase=phase)

    views = list(race_views.live_views(feed(), 0.25, 1.0, now=lambda: current[0]))
    # panes: loading, the first tokens, then every >= 0.25 s (0.1 is skipped), and the final state
    assert [v.status != "" for v in views] == [True] * 7
    assert [v.alpha is not None for v in views] == [True, False, False, False, False, True, True]
    assert views[-1].final_events == [] and all(v.final_events is None for v in views[:-1])


def test_app_examples_file_matches_the_app():
    """assets/profiles/app-examples.jsonl (what `bench --prompts` measures the default race on, README) is the app's own
    example prompts, in order."""
    import json
    from pathlib import Path

    rows = [json.loads(line) for line in (Path(__file__).parent.parent / "assets/profiles/app-examples.jsonl").open()]
    assert [(r["category"], r["prompt"], r["temperature"], r["lesson"], r["shows"]) for r in rows] == [
        (e.category, e.prompt, e.temperature, title, e.shows) for title, *pair in logic.EXAMPLE_PAIRS for e in pair]
    assert logic.DEFAULT_PROMPT == rows[0]["prompt"]


def test_examples_come_in_labelled_pairs_that_show_both_sides():
    """Each pair's label names its lesson and each side what it shows; the greedy/sampled pair differs only in its
    temperature, and the rows carry it (gr.Examples fills the prompt and the temperature)."""
    rows, labels = logic.example_rows()
    assert len(rows) == len(labels) == 2 * len(logic.EXAMPLE_PAIRS)
    assert all(len(r) == 2 and isinstance(r[1], float) for r in rows)
    titles = [title for title, *_ in logic.EXAMPLE_PAIRS]
    assert any("repeats" in t for t in titles) and any("sampled" in t for t in titles)
    for (title, a, b), (la, lb) in zip(logic.EXAMPLE_PAIRS, zip(labels[::2], labels[1::2])):
        assert la == f"{title} · A: {a.shows}" and lb == f"{title} · B: {b.shows}" and a != b
        if "sampled" in title:
            assert (a.prompt, a.temperature, b.temperature) == (b.prompt, 0.0, 0.7)


def test_the_tree_panel_opens_on_the_longest_accepted_path_once_the_race_is_done():
    from dataclasses import replace

    from specviz.ui import plots

    # steps keeping 2, 2 (with more drafts), 1 and 0 drafts: the race's last step drafted nothing
    one = replace(PARTIAL, drafts=PARTIAL.drafts[:1] + tuple(replace(d, verdict=Verdict.REJECTED)
                                                             for d in PARTIAL.drafts[1:2]))
    events = [replace(e, step=i) for i, e in enumerate([FULL, PARTIAL, one, NO_DRAFT])]
    assert [e.n_accepted for e in events] == [2, 2, 1, 0] and len(PARTIAL.drafts) > len(FULL.drafts)
    assert plots.longest_path_step(events) == 1 and plots.longest_path_step([]) == 0
    assert plots.longest_path_step([events[2], events[1], events[1]]) == 1  # a tie: the earliest
    snap = snapshot(AR, events)
    assert "Candidate tree of step 2: kept 2 of" in race_views.view_of(snap).tree.layout.title.text
    snap.phase = "running"  # live: the latest step
    assert "Candidate tree of step 4:" in race_views.view_of(snap).tree.layout.title.text


def test_summary_opens_with_the_why_line_and_gives_both_acceptances():
    import html

    from specviz.metrics import why_line

    snap = snapshot(AR, [PARTIAL, FULL])  # a chain: 2 of 4 kept, 1 refused, 1 never judged; then 2 of 2 kept
    out = race_html.summary_html(snap)
    assert out.index('id="why-line"') < out.index("sv-badges")
    line = why_line(snap.comparison)
    assert html.escape(line) in out and line.startswith("All 4 kept guesses were draft model's own guesses")
    assert "4 of the 5 guesses the target judged were kept" in out and "4 of 6 = 0.67" in out
