"""The race tab's what-if panel without a server: the finished race re-timed on this machine, each loaded profile and
each device's roofline bound; a malformed profile file gets one line and the table stays."""
from __future__ import annotations

import html
import json
import re

from test_whatif import AR, SPEC, profile

from specviz import whatif
from specviz.config import DecodeConfig
from specviz.metrics import compare
from specviz.ui import logic, race, race_html


def finished() -> logic.RaceSnapshot:
    snap = logic.RaceSnapshot(DecodeConfig(method="eagle"), "int8", phase="done")
    snap.lanes["ar"].events, snap.lanes["spec"].events = list(AR), list(SPEC)
    snap.comparison = compare(AR, SPEC, "eagle", True)
    target = whatif.Target(weight_bytes=270_000_000, macs_per_row=135e6, draft_bytes=9_000_000)
    snap.what_if = whatif.RaceClock(whatif.Recorded.of(SPEC, AR), profile([1.0, 1.05, 1.1, 1.3, 1.8]), target, "eagle")
    return snap


def kinds(panel: str) -> list[tuple[str, float]]:
    return [(k, float(v)) for k, v in re.findall(r'data-kind="(\w+)" data-speedup="([\d.]+)"', panel)]


def test_the_panel_shows_this_machine_then_one_roofline_row_per_device():
    snap = finished()
    panel = race_html.what_if_html(snap)
    rows = kinds(panel)
    assert rows[0][0] == "here" and abs(rows[0][1] / snap.comparison.speedup - 1) < 0.10
    assert [k for k, _ in rows[1:]] == ["roofline"] * len(whatif.load_devices())
    assert race_html.ROOFLINE_NOTE in panel and "NVIDIA H100 SXM" in panel
    assert race_html.WHATIF_EMPTY in race_html.what_if_html(None)
    result = snap.result()["what_if"]
    assert len(result["rows"]) == 1 + len(whatif.load_devices()) and result["rows"][0]["name"] == "this machine"


def test_a_loaded_profile_adds_a_row_and_a_malformed_one_gets_one_line(tmp_path):
    snap = finished()
    good = tmp_path / "gpu.json"
    good.write_text(json.dumps({"hardware": "a GPU", "profile": profile([1.0, 1.0, 1.0, 1.0, 1.1], 0.002).to_dict(),
                                "costs": [{"method": "eagle", "c": 0.3}]}))
    panel, loaded = race.add_profile(snap, str(good), [])
    assert loaded == [str(good)] and [k for k, _ in kinds(panel)][:2] == ["here", "profile"]
    assert "a GPU (gpu.json)" in panel and "id=\"whatif-error\"" not in panel
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    panel, still = race.add_profile(snap, str(bad), loaded)
    assert still == loaded and [k for k, _ in kinds(panel)][:2] == ["here", "profile"]  # the table stays
    error = html.unescape(re.search(r'id="whatif-error">(.*?)</div>', panel).group(1))
    assert "\n" not in error and "'bad.json' is not a verify profile" in error and str(tmp_path) not in error
    panel, none = race.add_profile(None, str(bad), [])  # before any race: the error, no table
    assert none == [] and "whatif-error" in panel and race_html.WHATIF_EMPTY in panel
