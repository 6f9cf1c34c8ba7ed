"""The race of several drafters (specviz/ui/many.py): its lanes as a form or a script names them, the race itself on
the real default target (every greedy lane identical to AR), and /race_many through the real gradio client."""
from __future__ import annotations

import pytest

from specviz import hardware
from specviz.config import DecodeConfig
from specviz.errors import ConfigError
from specviz.ui import many

PROMPT = "Write a Python function that adds two numbers."
N = 24


def test_lanes_are_named_as_bench_names_them():
    pair = hardware.default_pair()
    lanes = many.parse_lanes("pld:2, eagle:1+pld:4+ret:4, draft", DecodeConfig(max_new_tokens=N), pair)
    assert list(lanes) == ["pld:2", "eagle:1+pld:4+ret:4", "draft"]
    pld, eagle, draft = (cfg for cfg, _ in lanes.values())
    assert (pld.method, pld.gamma) == ("pld", 2)
    assert (eagle.method, eagle.gamma, eagle.lookup, eagle.retrieve) == ("eagle", 1, 4, 4)
    assert draft.method == "draft" and draft.gamma == pair.gamma_for("draft") and draft.lookup == 0
    assert all(cfg.max_new_tokens == N for cfg, _ in lanes.values())
    default = many.parse_lanes("", DecodeConfig(), pair)  # the default lanes: this machine's race first
    assert list(default) == [f"default ({pair.race()})", "pld:2", "draft"]
    assert default[f"default ({pair.race()})"][0].method == pair.method


@pytest.mark.parametrize("text, needle", [
    ("pld, eagle, draft, medusa", "give 1 to 3"),
    ("pld, pld", "twice"),
    ("eagle@some/folder", "drop the @ part"),
    ("ar", "not a speculative method"),
    ("eagle+foo", "+pld (prompt lookup)"),
    ("pld:0", "gamma"),
])
def test_bad_lanes_are_one_line(text, needle):
    with pytest.raises(ConfigError) as info:
        many.parse_lanes(text, DecodeConfig(), hardware.default_pair())
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_three_lanes_on_one_clock_are_each_identical_to_plain_decoding(target):
    lanes = many.parse_lanes("pld:2, eagle:1+pld:4+ret:4, draft", DecodeConfig(max_new_tokens=N),
                             hardware.default_pair())
    snaps = []
    for snap in many.lanes_stream(PROMPT, lanes, target.name):
        snaps.append((snap.phase, {k: lane.clock for k, lane in snap.lanes.items()},
                      {k for k, lane in snap.lanes.items() if not lane.done}))
    assert snap.phase == "done" and snaps[0][0] == "loading"
    ar = snap.lanes["ar"].token_ids
    assert len(ar) == N
    for name in lanes:
        assert snap.lanes[name].token_ids == ar, name
        assert snap.comparisons[name].identical is True
    board = snap.leaderboard()
    assert [r["lane"] for r in board] == sorted(lanes, key=lambda n: -snap.comparisons[n].speedup)
    # one clock: every tick advanced the unfinished lane that had used the least compute, so no unfinished lane ever
    # leads another by more than the longest single step any lane took (a wall-time bound would fail on a busy host)
    every = [clocks for _, clocks, _ in snaps]
    longest = max(b[k] - a[k] for a, b in zip(every, every[1:]) for k in a)
    spreads = [max(c[k] for k in live) - min(c[k] for k in live)
               for phase, c, live in snaps[len(lanes) + 2:] if phase == "running" and len(live) > 1]
    assert spreads and max(spreads) <= longest + 1e-9, (max(spreads), longest)
    html = many.board_html(snap)
    assert html.count("<tr") == len(lanes) + 2 and "✓" in html
    result = snap.result()
    assert [lane["text"] for lane in result["lanes"]] == [result["ar_text"]] * len(lanes)


gradio_client = pytest.importorskip("gradio_client")


def test_race_many_endpoint(app_url):
    client = gradio_client.Client(app_url, verbose=False)
    out = client.predict(prompt=PROMPT, lanes="pld:2, draft", max_new_tokens=N, api_name="/race_many")
    assert [lane["lane"] for lane in out["lanes"]] == ["pld:2", "draft"]
    assert all(lane["text"] == out["ar_text"] and lane["summary"]["identical"] for lane in out["lanes"])
    assert {r["lane"] for r in out["leaderboard"]} == {"pld:2", "draft"} and out["hardware"]
    with pytest.raises(Exception) as info:
        client.predict(prompt=PROMPT, lanes="pld, pld", max_new_tokens=4, api_name="/race_many")
    assert "twice" in str(info.value)
    again = client.predict(prompt=PROMPT, lanes="pld:2", max_new_tokens=4, api_name="/race_many")  # still serving
    assert again["lanes"][0]["text"] == again["ar_text"]
