"""A real llama.cpp llama-server (`make server` builds it into .venv/bin) serving the embedded GGUF on 127.0.0.1 with
n-gram speculation: `watch` and `probe` must agree with the figures the server puts in its own responses
(timings.draft_n / draft_n_accepted); a second instance without speculation is the greedy reference. Skipped, saying
why, when the binary is not built."""
import io
import json
import threading
import time

import pytest

from specviz.cli.main import main
from specviz.paths import SPEC_BENCH
from specviz.serving import local, probe, server, watch
from specviz.serving.prometheus import scrape

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(server.binary() is None, reason="llama-server is not built: run `make server`")]

COMMON = ["--ctx-size", "4096", "--parallel", "1", "--threads", "1", "--metrics", "--seed", "0"]
SPECULATION = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "8"]
TRAFFIC_S = 10.0  # seconds of traffic under the watch
MAX_TOKENS = 64
PROMPTS = [  # answers that repeat their prompt or themselves, so the n-gram drafter has something to find
    "Repeat this list exactly three times, one item a line: apples, pears, plums, cherries, grapes, figs.",
    "Write the numbers from 1 to 40 separated by commas.",
    "Copy this sentence twice: The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Why is the sky blue? Answer in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number, then the same function with a docstring.",
]


@pytest.fixture(scope="module")
def spec_server():
    with server.LlamaServer(server.embedded_gguf(), COMMON + SPECULATION) as srv:
        yield srv


@pytest.fixture(scope="module")
def plain_server():
    with server.LlamaServer(server.embedded_gguf(), COMMON) as srv:
        yield srv


def _from_responses(responses: list[dict]) -> dict:
    drafted = sum(r["timings"].get("draft_n", 0) for r in responses)  # left out when a request drafted nothing
    accepted = sum(r["timings"].get("draft_n_accepted", 0) for r in responses)
    generated = sum(r["timings"]["predicted_n"] for r in responses)
    return {"draft_tokens": drafted, "accepted_tokens": accepted, "acceptance_rate": accepted / drafted,
            "generated_tokens": generated, "tokens_per_forward": generated / (generated - accepted)}


def test_watch_agrees_with_the_responses(spec_server, tmp_path):
    """≥ 10 s of traffic under `watch`: its draft acceptance and τ equal the responses' own figures (within 0.02;
    the counts themselves must match exactly, since the watch's first scrape precedes the traffic and its last one
    follows it)."""
    started, finished, responses = threading.Event(), threading.Event(), []
    last_taken = []

    def read(url):
        if last_taken:
            raise KeyboardInterrupt  # the scrape after the traffic ended is in: stop the watch
        done = finished.is_set()
        snap = scrape(url)
        started.set()
        if done:
            last_taken.append(snap)
        return snap

    def drive():
        started.wait()
        t_end, i = time.monotonic() + TRAFFIC_S, 0
        while time.monotonic() < t_end:
            temperature = 0.0 if i % 2 == 0 else 0.8
            responses.append(probe.chat(spec_server.url, PROMPTS[i % len(PROMPTS)], MAX_TOKENS, temperature, i, 120))
            i += 1
        finished.set()

    driver = threading.Thread(target=drive)
    driver.start()
    out = io.StringIO()
    w = watch.run(spec_server.url, interval=1.0, json_path=str(tmp_path / "watch.json"), out=out, live=False,
                  read=read)
    driver.join()
    s = json.loads((tmp_path / "watch.json").read_text())["summary"]
    truth = _from_responses(responses)
    assert s["engine"] == "llamacpp" and s["seconds"] >= TRAFFIC_S
    assert truth["draft_tokens"] > 0, "the n-gram drafter never drafted: the traffic does not exercise speculation"
    assert (s["draft_tokens"], s["accepted_tokens"]) == (truth["draft_tokens"], truth["accepted_tokens"])
    assert s["acceptance_rate"] == pytest.approx(truth["acceptance_rate"], abs=0.02)
    assert s["tokens_per_forward"] == pytest.approx(truth["tokens_per_forward"], abs=0.02)
    assert s["tau"] is not None and s["tau"] > 1 and s["drafts"] > 0
    assert s["verdict"].split(":")[0] in ("healthy", "collapsed") and w.series
    assert "llamacpp:spec_decode_num_draft_tokens_total" in s["names"]


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason=f"Spec-Bench is not at {SPEC_BENCH}")
def test_probe_spec_bench_against_a_reference(spec_server, plain_server, tmp_path, capsys):
    """The 13 Spec-Bench categories through the speculative server, greedy and sampled, the plain server as the
    reference: JSON and HTML with per-category figures; the /metrics deltas around each request equal the
    response's own draft counts."""
    out_json, out_html = tmp_path / "probe.json", tmp_path / "probe.html"
    code = main(["probe", spec_server.url, "--prompts", str(SPEC_BENCH), "--limit", "13", "--max-new-tokens", "32",
                 "--reference", plain_server.url, "--json", str(out_json), "--html", str(out_html)])
    d = json.loads(out_json.read_text())
    assert d["engine"] == "llamacpp" and d["errors"] == 0
    greedy = [c for c in d["by_category"] if c["mode"] == "greedy"]
    assert len(greedy) == 13 and {c["mode"] for c in d["by_category"]} == {"greedy", "sampled"}
    probes = [r for r in d["requests"] if r["mode"] != "reference"]
    assert len(probes) == 26 and all(r["source"] == "timings" for r in probes)
    for r in probes:  # per request, the server's counters moved by exactly what the response reports
        assert (r["metrics_draft_tokens"], r["metrics_accepted_tokens"]) == (r["draft_tokens"], r["accepted_tokens"])
    assert d["identity"]["compared"] == 13
    assert code == (0 if d["identity"]["passed"] else 1)
    html = out_html.read_text()
    assert "Greedy identity against" in html and "By category" in html and "plotly" in html
    assert "verdict: " + d["verdict"] in capsys.readouterr().out


def test_probe_catches_a_reference_that_differs(spec_server, tmp_path, capsys):
    """The identity check can fail: a reference whose greedy choice is pushed off (a logit bias on a common token)
    must be reported as differing, with exit code 1."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "category": "c", "prompt": p}) + "\n"
                               for i, p in enumerate(PROMPTS[:2])))
    with server.LlamaServer(server.embedded_gguf(), COMMON + ["--logit-bias", "28+8"]) as biased:
        code = main(["probe", spec_server.url, "--prompts", str(prompts), "--max-new-tokens", "32", "--temperature",
                     "0", "--reference", biased.url, "--json", str(tmp_path / "p.json")])
    d = json.loads((tmp_path / "p.json").read_text())
    assert code == 1 and d["identity"]["differs"] >= 1 and not d["correct"]
    assert "DIFFERS from the reference" in capsys.readouterr().out


# -- EAGLE-3 and DFlash drafters trained here, served from their GGUF exports (`export --format gguf`) -----------------
# llama-server on the target's fp32 export (the numbers specviz decodes) as `serve --engine llama.cpp` starts it;
# probe --local runs the same drafter in specviz: every greedy answer equals the plain fp32 server's, and the served
# and local acceptance agree within local.AGREE at positions 0-2.

TRAINED_PROMPTS = PROMPTS[2:4]  # two cheap prompts, 32 tokens each: one copy task, one open answer
TRAINED_TOKENS = 32


@pytest.fixture(scope="module")
def fp32_plain():
    from specviz.serving import engines

    with engines.Engine(engines.reference("llama.cpp")) as engine:
        yield engine


def _served_beside_local(url: str, drafter: str, reference: str, tmp_path) -> dict:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "category": "c", "prompt": p}) + "\n"
                               for i, p in enumerate(TRAINED_PROMPTS)))
    main(["probe", url, "--prompts", str(prompts), "--max-new-tokens", str(TRAINED_TOKENS), "--temperature", "0",
          "--reference", reference, "--local", "--drafter", drafter, "--json", str(tmp_path / "p.json")])
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["errors"] == 0 and d["identity"]["passed"], d["verdict"]  # greedy: the plain server's answers
    assert d["identity"]["compared"] == len(TRAINED_PROMPTS)
    served, mine = d["served"]["per_position"], d["local"]["per_position"]
    assert d["served"]["drafts"] > 0 and len(served) == len(mine)
    gaps = [abs(served[i] - mine[i]) for i in range(min(3, len(served)))]
    assert max(gaps) <= local.AGREE, d["local_verdict"]
    return d


def test_llama_server_serves_the_eagle3_gguf(fp32_plain, tmp_path):
    """`serve --engine llama.cpp --drafter eagle`: the shipped EAGLE-3 as `--spec-type draft-eagle3` drafts what
    specviz drafts (its first draft is kept about a third of the time on both)."""
    from specviz.serving import engines

    p = engines.plan("llama.cpp", "eagle")
    assert p.speculative["--spec-type"] == "draft-eagle3" and p.draft.endswith("eagle3-gguf/draft.gguf")
    with engines.Engine(p) as engine:
        d = _served_beside_local(engine.url, "eagle", fp32_plain.url, tmp_path)
    assert len(d["served"]["per_position"]) == engines.GAMMA and d["served"]["per_position"][0] > 0.1


def _dflash_folder(tmp_path):
    """The shipped DFlash drafter when there is one; else a random one for the real target (block 4, 2 layers), which
    llama-server must still serve and decode exactly, though it is rarely right."""
    import torch

    from specviz.drafters import trained
    from specviz.drafters.config import DrafterConfig
    from specviz.paths import shipped_drafter

    shipped = shipped_drafter("smollm2-135m", "dflash")
    if (shipped / "model.safetensors").is_file():
        return shipped
    cfg = DrafterConfig(kind="dflash", target="smollm2-135m", hidden_size=576, vocab_size=49152, draft_vocab=2048,
                        num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536, rope_theta=100000.0,
                        feature_layers=[2, 15, 28], block_size=4, num_hidden_layers=2, mask_token_id=2)
    torch.manual_seed(0)
    folder = tmp_path / "dflash-random"
    trained.save(folder, trained.build_module(cfg), cfg, torch.arange(2048), "a random DFlash drafter (tests)")
    return folder


def test_llama_server_serves_the_dflash_gguf(fp32_plain, tmp_path):
    """`serve --engine llama.cpp --drafter DFLASH`: `--spec-type draft-dflash` with n_max = block_size - 1 (llama.cpp
    runs a block of n_max + 1, specviz the trained block: only then are the drafts the same)."""
    from specviz.serving import engines

    folder = _dflash_folder(tmp_path)
    block = json.loads((folder / "config.json").read_text())["block_size"]
    p = engines.plan("llama.cpp", str(folder))
    assert (p.speculative["--spec-type"], p.speculative["--spec-draft-n-max"]) == ("draft-dflash", str(block - 1))
    with engines.Engine(p) as engine:
        d = _served_beside_local(engine.url, str(folder), fp32_plain.url, tmp_path)
    assert len(d["served"]["per_position"]) == block - 1


def test_serve_none_is_the_engine_without_speculation(capsys):
    """`serve --drafter none`: the reference a probe's --reference compares greedy answers with (a new user had to
    assemble it by hand from serve's printout); its start line is a command a shell takes, without --spec-type."""
    import shlex

    assert main(["serve", "--engine", "llama.cpp", "--drafter", "none", "--duration", "1"]) == 0
    out = capsys.readouterr().out
    start = next(line for line in out.splitlines() if line.startswith("starting llama.cpp without speculation"))
    argv = shlex.split(start.split(": ", 1)[1])
    assert argv[0].endswith("llama-server") and "--spec-type" not in argv and "--metrics" in argv, start
    assert "--reference http://127.0.0.1:" in out and "stopped the engine" in out, out
