"""The what-if clock: recorded steps re-timed under other T(k) and drafter costs."""
from __future__ import annotations

import json

import pytest

from specviz import whatif
from specviz.events import DraftToken, EmittedToken, StepEvent, Verdict
from specviz.metrics import CostProfile

SIZES = [1, 2, 4, 8, 16]


def profile(ratios, t1=0.010) -> CostProfile:
    seconds = [t1 * r for r in ratios]
    return CostProfile("cpu", "bfloat16", "fused", 128, 3, SIZES, seconds, seconds)


def event(step: int, n_drafts: int, n_kept: int, seconds: float, draft_s: float = 0.0, forwards: int = 0):
    drafts = tuple(DraftToken(7, "x", Verdict.ACCEPTED if i < n_kept - 1 else Verdict.REJECTED, 0.5)
                   for i in range(n_drafts))
    emitted = tuple(EmittedToken(7, "x", Verdict.ACCEPTED) for _ in range(n_kept))
    return StepEvent(step=step, drafts=drafts, emitted=emitted, draft_s=draft_s, verify_s=seconds - draft_s,
                     draft_forwards=forwards)


PREFILL = event(0, 0, 1, 0.05)
AR = [PREFILL] + [event(i, 0, 1, 0.010) for i in range(1, 41)]                   # 10 ms a token
SPEC = [PREFILL] + [event(i, 3, 2, 0.014, 0.002, 1) for i in range(1, 21)]        # 4 rows, 2 kept, 14 ms a step


def test_steps_skip_the_prefill_and_count_rows():
    steps = whatif.steps_of(SPEC)
    assert len(steps) == 20 and steps[0].rows == 4 and steps[0].tokens == 2 and steps[0].draft_forwards == 1


def test_this_machine_reproduces_the_measured_speedup():
    rec = whatif.Recorded.of(SPEC, AR)
    assert rec.measured_speedup == pytest.approx(2 * 0.010 / 0.014)
    here = profile([1.0, 1.05, 1.1, 1.3, 1.8])
    assert rec.draft_c() == pytest.approx(0.2)
    row = whatif.table(rec, here, whatif.Target(2, 1), devices=[])[0]
    assert row.speedup == pytest.approx(rec.measured_speedup, rel=0.01)  # T(4) + c + bookkeeping = the step
    assert row.ar_tok_s == pytest.approx(100) and row.crossover == 4
    # steps of uneven cost, and a profile dearer than they were (T(k) moved since the calibration): the row stays
    # the measurement (a median bookkeeping read 1.43x and 1.25x here against the 1.06x measured)
    uneven = [PREFILL] + [event(i, 3, 2, 0.014 if i % 3 else 0.030, 0.002, 1) for i in range(1, 21)]
    rec = whatif.Recorded.of(uneven, AR)
    for dear in ([1.0, 1.05, 1.1, 1.3, 1.8], [1.0, 1.2, 1.4, 1.8, 2.4]):
        row = whatif.table(rec, profile(dear), whatif.Target(2, 1), devices=[])[0]
        assert row.speedup == pytest.approx(rec.measured_speedup, rel=1e-9)


def test_cheaper_rows_and_drafts_predict_more():
    rec = whatif.Recorded.of(SPEC, AR)
    flat = whatif.Clock("flat", "test", lambda k: 1.0, 0.0, 0.001, bookkeeping=False)
    assert rec.retime(flat).speedup == pytest.approx(2.0)  # τ: rows free, drafting free
    assert rec.retime(flat).tok_s == pytest.approx(2000)
    steep = whatif.Clock("steep", "test", lambda k: float(k), 0.0, None, bookkeeping=False)
    assert rec.retime(steep).speedup == pytest.approx(0.5) and rec.retime(steep).tok_s is None


def test_roofline_devices_cross_over_where_arithmetic_meets_the_stream():
    target = whatif.Target(weight_bytes=270_000_000, macs_per_row=135e6, draft_bytes=27_000_000)
    gpu = whatif.Device("big", "gpu", 3350, 989, "sheet")
    cpu = whatif.Device("small", "cpu", 25, 0.34, "sheet")  # 170 G multiply-adds a second
    stream_gpu, row_gpu = 270e6 / 3350e9, 2 * 135e6 / 989e12
    assert gpu.clock(target).crossover() == int(1.1 * stream_gpu / row_gpu)
    assert cpu.clock(target).crossover() == int(1.1 * (270e6 / 25e9) / (2 * 135e6 / 0.34e12))
    assert gpu.clock(target).c == pytest.approx(0.1)
    rows = whatif.table(whatif.Recorded.of(SPEC, AR), profile([1.0] * 5), target, devices=[gpu, cpu])
    assert [r.name for r in rows] == ["this machine", "big", "small"]
    assert rows[1].source.startswith("roofline") and rows[1].tok_s > 100 * rows[2].tok_s
    assert rows[1].speedup == pytest.approx(rows[2].speedup)  # 4 rows are free on both
    wide = whatif.Recorded.of([PREFILL] + [event(i, 39, 3, 0.03) for i in range(1, 11)], AR)  # 40 rows a step
    gpu_row, cpu_row = (wide.retime(d.clock(target)) for d in (gpu, cpu))
    assert gpu_row.speedup == pytest.approx(3.0) and cpu_row.speedup < 0.4 * gpu_row.speedup  # 40 rows of arithmetic
    assert "rows free up to" in whatif.format_table(rows, 1.4)


def test_shipped_devices_name_their_sources():
    devices = whatif.load_devices()
    assert len(devices) >= 6 and all(d.source and d.bandwidth_gb_s > 0 and d.peak_tflops > 0 for d in devices)
    assert whatif.device("nvidia h100").name == "NVIDIA H100 SXM"
    with pytest.raises(whatif.WhatIfError, match="'tpu' is unknown: use a profile file or one of"):
        whatif.device("tpu")
    with pytest.raises(whatif.WhatIfError, match="ambiguous"):
        whatif.device("NVIDIA")


def test_a_profile_file_is_a_clock_and_a_bad_one_a_one_line_error(tmp_path):
    good = tmp_path / "gpu.json"
    prof = profile([1.0, 1.0, 1.01, 1.02, 1.05], t1=0.004)
    good.write_text(json.dumps({"hardware": "NVIDIA H200 (cuda), bf16", "profile": prof.to_dict(),
                                "costs": [{"method": "eagle", "c": 0.3}]}))
    clock = whatif.profile_clock(good, "eagle")
    assert clock.c == 0.3 and clock.ratio(16) == pytest.approx(1.05) and "H200" in clock.name
    assert whatif.profile_clock(good, "pld").c < 0  # no cost there: this machine's drafter cost is used
    for text in ("{", "{}", json.dumps({"profile": {"tokens": [1]}})):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(whatif.WhatIfError) as err:
            whatif.profile_clock(bad)
        assert "is not a verify profile" in str(err.value) and "\n" not in str(err.value)
        assert "Error" not in str(err.value)  # words, not an exception's name (JSONDecodeError, KeyError)
    with pytest.raises(whatif.WhatIfError, match="cannot be read"):
        whatif.profile_clock(tmp_path / "missing.json")
