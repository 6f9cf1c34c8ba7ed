"""The CLI: bad input gets one line and exit code 2; generate and bench work on the real target."""
import json

import pytest

from specviz import hardware
from specviz.cli.bench import format_summary, read_prompts, with_fastest_plain
from specviz.cli.main import main
from specviz.config import DecodeConfig, check_prompt
from specviz.errors import ConfigError
from specviz.models import drafts
from specviz.models import loader as models

BAD = [
    (["--gamma", "0"], "gamma=0 is out of range"),
    (["--gamma", "17"], "gamma=17 is out of range"),
    (["--gamma", "lots"], "gamma='lots' is not valid"),
    (["--temperature", "-1"], "temperature=-1 is out of range"),
    (["--temperature", "warm"], "temperature='warm' is not a number: use 0 (greedy) up to 100"),
    (["--max-new-tokens", "2.5"], "max_new_tokens='2.5' is not an integer: use 1.."),
    (["--top-p", "0"], "top_p=0 is out of range"),
    (["--top-p", "1.5"], "top_p=1.5 is out of range"),
    (["--max-new-tokens", "0"], "max_new_tokens=0 is out of range"),
    (["--max-new-tokens", "99999"], "max_new_tokens=99999 is out of range"),
    (["--method", "magic"], "method='magic' is unknown"),
    (["--lookup", "3"],
     "lookup=3 applies to the tree drafters only: use it with eagle or medusa or dflash, not vanilla"),
    (["--method", "eagle", "--lookup", "-2"], "lookup=-2 is out of range"),
    (["--target", "no-such-model"], "model spec 'no-such-model' is unknown"),
    (["--target", "/nope/model.gguf"], "model file '/nope/model.gguf' does not exist"),
    (["--target", "./missing-folder"], "model path './missing-folder' does not exist"),
]


@pytest.mark.parametrize("extra,message", BAD)
def test_bad_input_is_one_line_exit_2(capsys, extra, message):
    code = main(["generate", "--prompt", "hi", *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_empty_prompt(capsys):
    assert main(["generate", "--prompt", "   "]) == 2
    assert "prompt is empty" in capsys.readouterr().err


def test_config_normalises_and_rejects():
    assert DecodeConfig(gamma="auto").adaptive and DecodeConfig(gamma="3").gamma == 3
    with pytest.raises(ConfigError, match="top_k=-1"):
        DecodeConfig(top_k=-1)
    with pytest.raises(ConfigError, match="limit is"):
        check_prompt("x" * 100_000)


def test_incompatible_tokenizer_is_refused(target, tiny_target):
    with pytest.raises(models.ModelError, match="draft tokenizer .* differs from target tokenizer"):
        drafts.check_tokenizers(target, tiny_target)


def test_read_prompts_formats(tmp_path):
    jl = tmp_path / "q.jsonl"
    jl.write_text('{"question_id": 1, "category": "a", "turns": ["one", "two"]}\n'
                  '{"id": "x", "category": "b", "prompt": "three"}\n'
                  '{"question_id": 3, "category": "a", "turns": ["four"]}\n')
    rows = read_prompts(str(jl), None, 2)
    assert [(r["id"], r["category"], r["prompt"]) for r in rows] == [(1, "a", "one"), ("x", "b", "three")]
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\nsecond prompt\n")
    assert [r["prompt"] for r in read_prompts(str(txt), None, None)] == ["first prompt", "second prompt"]
    assert main(["bench", "--prompts", str(tmp_path / "none.jsonl"), "--json", str(tmp_path / "o.json")]) == 2
    for bad in ("pld@x", "eagle@", "turbo@x", "eagle+foo", "pld+pld:2", "eagle+pld:99",
                "eagle+ret:99", "pld+ret", "eagle+pld+rest"):  # before any model loads
        assert main(["bench", "--prompts", str(txt), "--method", bad, "--json", str(tmp_path / "o.json")]) == 2


def test_generate_race_on_real_target(target, capsys):
    code = main(["generate", "--prompt", "Name a colour.", "--max-new-tokens", "12", "--race", "--device", "cpu",
                 "--dtype", "float32"])
    out = capsys.readouterr().out
    assert code == 0
    assert "identical to plain decoding" in out and "speedup" in out and "τ=" in out


def test_generate_race_prices_a_tree_as_the_app_does(target, capsys, monkeypatch):
    """A tree drafter's prediction is the tree formula, priced with this machine's verify profile (the calibration's,
    else measured), as the app's summary is: it printed 'Leviathan prediction 0.28x' for EAGLE at a measured
    1.33x (every tree row priced as a full target step, no profile). The why-line follows."""
    from specviz.core import profile as profiles

    asked = []
    monkeypatch.setattr(profiles, "profile_of", lambda t, measure=True: asked.append(measure))
    code = main(["generate", "--prompt", "Name a colour.", "--max-new-tokens", "12", "--race", "--method", "eagle",
                 "--device", "cpu", "--dtype", "float32"])
    out = capsys.readouterr().out
    assert code == 0 and asked == [True]
    assert "(tree prediction, from each kind of node's acceptance: " in out and "Leviathan" not in out
    assert "kept guesses were" in out or "Nothing was drafted" in out  # metrics.why_line


def test_bench_json_on_real_target(target, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "category": "qa", "prompt": "What is the boiling point of water?"}\n'
                       '{"id": 2, "category": "writing", "prompt": "Write a haiku about rain."}\n')
    out = tmp_path / "bench.json"
    second = "eagle:2@assets/drafters/smollm2-135m-eagle"  # a second EAGLE drafter (here the same folder) over one AR
    code = main(["bench", "--prompts", str(prompts), "--method", "vanilla", "pld", "eagle:1", second,
                 "eagle+pld:3+ret:3", "--max-new-tokens",
                 "12", "--compare-hf", "--no-ar-reference", "--json", str(out), "--device", "cpu", "--dtype",
                 "float32"])
    assert code == 0
    report = json.loads(out.read_text())
    assert {"device", "dtype", "torch", "transformers", "rows", "summary"} <= set(report)
    # an EAGLE entry without +pld/+ret races this machine's default branches, and its label names them
    pair = hardware.default_pair("cpu")
    branches = "".join(f"+{kind}:{n}" for kind, n in (("pld", pair.lookup_for("eagle")),
                                                      ("ret", pair.retrieve_for("eagle"))) if n)
    second = second.replace("@", branches + "@")
    assert {r["method"] for r in report["rows"]} == {"vanilla", "pld", "eagle:1" + branches, second,
                                                 "eagle+pld:3+ret:3", "hf-assisted"}
    assert len(report["rows"]) == 12
    coverage = {s["method"]: s["draft_vocab_coverage"] for s in report["summary"]}
    assert 0.5 < coverage["eagle:1" + branches] <= 1.0 and coverage["pld"] is None  # the compressed vocabulary
    row_keys = {"id", "category", "method", "new_tokens", "seconds", "tok_per_s", "ar_seconds", "ar_tok_per_s",
                "speedup", "alpha", "tau", "identical_to_ar"}
    assert all(row_keys <= set(r) for r in report["rows"])
    for s in report["summary"]:
        assert {"method", "prompts", "new_tokens", "tok_per_s", "ar_tok_per_s", "speedup", "alpha", "tau",
                "identical_all"} <= set(s)
        assert s["identical_all"] is True, s
        # without the stock references the fastest plain decoder is specviz's own AR
        assert s["baseline"] == "ar" and s["speedup_over_fastest"] == pytest.approx(s["speedup"]), s
    ar_ids = {r["id"]: r["token_ids"] for r in report["rows"] if r["method"] == "pld"}
    assert all(r["token_ids"] == ar_ids[r["id"]] and len(r["token_ids"]) == r["new_tokens"] for r in report["rows"])
    captured = capsys.readouterr()
    assert "over the fastest plain decoder of the run (ar," in captured.out
    assert not branches or f"races vanilla pld eagle:1{branches} {second}" in captured.err


def test_bench_headline_is_over_the_fastest_plain_decoder():
    row = {"prompts": 2, "new_tokens": 64, "speedup": None, "alpha": None, "tau": None, "identical_all": None}
    summary = [{**row, "method": "eagle", "tok_per_s": 60.0, "ar_tok_per_s": 30.0},
               {**row, "method": "ar-sdpa", "tok_per_s": 20.0, "ar_tok_per_s": 30.0},
               {**row, "method": "ar-fp32", "tok_per_s": 40.0, "ar_tok_per_s": 30.0}]
    out = {s["method"]: s for s in with_fastest_plain(summary)}
    assert out["eagle"]["baseline"] == "ar-fp32" and out["eagle"]["speedup_over_fastest"] == pytest.approx(1.5)
    assert out["ar-sdpa"]["speedup_over_fastest"] == pytest.approx(0.5)
    summary[2]["tok_per_s"] = 25.0  # specviz's AR (30) is now the fastest
    assert with_fastest_plain(summary)[0]["baseline"] == "ar"
    assert "over the fastest plain decoder of the run (ar, 30.0 tok/s)" in format_summary(summary)


def test_profile_command(target, tmp_path, capsys):
    out = tmp_path / "profile.json"
    code = main(["profile", "--sizes", "1,2,4", "--reps", "1", "--no-drafters", "--device", "cpu", "--json", str(out)])
    text = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert code == 0 and "| k | T(k) ms | T(k)/T(1) |" in text and f"verification: {target.guarantee}" in text
    assert d["profile"]["tokens"] == [1, 2, 4] and d["ratios"]["1"] == 1.0 and d["guarantee"] == target.guarantee
    roof = d["roofline"]  # the bytes each forward streams, the machine's read bandwidth and how close T(k) comes
    assert roof["tokens"] == [1, 2, 4] and roof["bandwidth_gb_s"] > 0 and len(roof["achieved_gb_s"]) == 3
    assert roof["weight_bytes"] > 100e6 and roof["bytes_per_step"][0] < roof["bytes_per_step"][2]
    assert "| k | MB a forward | floor ms | achieved GB/s |" in text
    assert main(["profile", "--sizes", "0"]) == 2
    assert "sizes=0 is out of range" in capsys.readouterr().err


def test_profile_always_measures_size_1(tiny_target, tmp_path, monkeypatch, capsys):
    """`profile --sizes 4,2` printed ratios over the smallest size measured under a T(k)/T(1) column (and wrote them
    as the JSON's ratios): size 1 is always measured now, so T(k)/T(1) is what it says. `--sizes ""` fell back to the
    defaults silently: one line."""
    from specviz.cli import profile as cli_profile

    monkeypatch.setattr(cli_profile, "load_target", lambda args: tiny_target)  # the tiny target: nothing downloads
    out = tmp_path / "profile.json"
    code = main(["profile", "--target", "smollm2-135m", "--sizes", "4,2", "--reps", "1", "--context", "8",
                 "--no-drafters", "--device", "cpu", "--json", str(out)])
    text = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert code == 0 and d["profile"]["tokens"] == [1, 2, 4] and list(d["ratios"]) == ["1", "2", "4"]
    assert d["ratios"]["1"] == 1.0 and "| 1 | " in text
    assert main(["profile", "--sizes", ""]) == 2
    err = capsys.readouterr().err
    assert "sizes='' is empty: give tokens per forward, 1..256" in err and err.count("\n") == 1, err

def test_bench_what_if_names_a_bad_value_before_any_model_loads(tmp_path, capsys):
    txt = tmp_path / "p.txt"
    txt.write_text("Name a colour.\n")
    code = main(["bench", "--prompts", str(txt), "--method", "pld", "--what-if", "tpu-v9", "--json",
                 str(tmp_path / "o.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "'tpu-v9' is neither a profile file nor a known device" in err
    assert "'NVIDIA H100 SXM'" in err


def test_bench_help_what_if_example_names_known_devices():
    """bench --help's --what-if example named `h100`, which the command refuses: each device it names is known."""
    import argparse
    import shlex

    from specviz import whatif
    from specviz.cli.main import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    text = next(a.help for a in sub._actions if a.dest == "what_if")
    devices = [v for v in shlex.split(text.split("e.g. --what-if ")[1]) if not v.endswith(".json")]
    assert devices and [whatif.device(v).name for v in devices] == ["NVIDIA T4", "NVIDIA H100 SXM"]

def test_bench_what_if_retimes_the_run_on_real_target(target, tmp_path, capsys):
    from specviz import whatif
    from specviz.metrics import CostProfile

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "category": "qa", "prompt": "What is the boiling point of water?"}\n')
    sizes, seconds = [1, 2, 4, 8, 16], [0.004, 0.004, 0.0041, 0.0042, 0.0045]
    gpu = tmp_path / "gpu.json"
    profile = CostProfile("cuda", "bf16", "sdpa", 300, 3, sizes, seconds, seconds)
    gpu.write_text(json.dumps({"hardware": "a test GPU", "profile": profile.to_dict()}))
    out = tmp_path / "bench.json"
    code = main(["bench", "--prompts", str(prompts), "--method", "pld", "--limit", "1", "--max-new-tokens", "16",
                 "--no-ar-reference", "--what-if", str(gpu), "nvidia t4", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert text.index("| method | prompts") < text.index("what-if: the same drafts re-timed")  # after the measured one
    assert "| this machine | measured here |" in text and "| a test GPU (gpu.json) | profile gpu.json" in text
    assert "| NVIDIA T4 | roofline bound" in text
    rows = json.loads(out.read_text())["what_if"]["pld"]
    assert [r["name"] for r in rows] == ["this machine", "a test GPU (gpu.json)", "NVIDIA T4"]
    assert rows[1]["speedup"] > 0 and rows[2]["c"] == 0.0  # prompt lookup reads no weights
    assert whatif.device("nvidia t4").name == "NVIDIA T4"
