"""Self-distillation at scale (specviz/train/distill.py): the prompt file cut into chunks answered by the target,
written once complete with a manifest; a rerun skips the verified chunks and redoes a corrupted one. Fast:
a tiny random model and a prompt file written in tmp_path (never ../shared, absent on a clean clone)."""
import gzip
import json

import pytest
import torch
from tiny import tiny_model

from specviz.cli.main import main
from specviz.core import answers
from specviz.models import loader as models
from specviz.train import answer, distill

SETTINGS = {"target": "tiny", "gguf_file": None, "dtype": "float32", "attention": "sdpa", "max_new_tokens": 4,
            "greedy": True, "chunk_size": 3}


def prompt_file(tmp_path, n=7):
    """n prompts of the tiny tokenizer's kind (space-separated ids), of varied lengths, gzipped JSONL."""
    path = tmp_path / "prompts.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(n):
            words = " ".join(str((i * 7 + j) % 60 + 1) for j in range(2 + i % 4))
            f.write(json.dumps({"id": f"p{i}", "source": "test", "category": "math" if i % 2 else "qa",
                                "prompt": words}) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(0)


def test_chunks_manifest_and_resume(tmp_path, tiny):
    prompts, out = prompt_file(tmp_path), tmp_path / "out"
    logs = []
    manifest = distill.generate_chunks(tiny, prompts, out, SETTINGS, batch_size=2, chunks=2, log=logs.append)
    assert [c["file"] for c in manifest["chunks"]] == ["chunk-00000.jsonl.gz", "chunk-00001.jsonl.gz"]
    assert manifest["prompts_sha256"] == answers.sha256_file(prompts) and manifest["prompts_total"] == 7
    rows = answers.read_examples(out / "chunk-00001.jsonl.gz")
    assert [r["id"] for r in rows] == ["p3", "p4", "p5"]  # file order, whatever the batching order
    with gzip.open(out / "chunk-00001.jsonl.gz", "rt") as f:  # stored: no index (read_examples adds the line number)
        assert set(json.loads(f.readline())) == {"id", "category", "prompt_ids", "answer_ids"}
    assert [r["i"] for r in rows] == [0, 1, 2]
    for r in rows:  # greedy answers, cut after EOS or at max_new_tokens
        assert 1 <= len(r["answer_ids"]) <= 4 and (len(r["answer_ids"]) == 4 or r["answer_ids"][-1] == 63)
    t = manifest["totals"]
    assert t["chunks"] == 2 and t["prompts"] == 6
    assert t["answer_tokens"] == sum(len(e["answer_ids"]) for e in answers.read_chunks(out))
    assert sum(c["prompts"] for c in manifest["categories"].values()) == 6
    assert json.loads((out / "manifest.json").read_text()) == manifest
    # the same rows batched otherwise give the same greedy answers (the tiny model has no near-ties)
    again = distill.answer_chunk(tiny, distill.read_prompt_rows(prompts)[3:6], 4, batch_size=1)
    assert [e["answer_ids"] for e in again] == [r["answer_ids"] for r in rows]

    first = (out / "chunk-00000.jsonl.gz").read_bytes()
    manifest = distill.generate_chunks(tiny, prompts, out, SETTINGS, batch_size=3, log=logs.append)  # resume: all
    assert (out / "chunk-00000.jsonl.gz").read_bytes() == first  # skipped, not rewritten
    assert [c["index"] for c in manifest["chunks"]] == [0, 1, 2] and manifest["chunks"][2]["prompts"] == 1
    assert manifest["totals"]["prompts"] == 7 and [e["i"] for e in answers.read_chunks(out)] == list(range(7))


def test_corrupted_chunk_is_redone(tmp_path, tiny):
    prompts, out = prompt_file(tmp_path), tmp_path / "out"
    distill.generate_chunks(tiny, prompts, out, SETTINGS, batch_size=4, chunks=2, log=lambda _: None)
    good = (out / "chunk-00001.jsonl.gz").read_bytes()
    (out / "chunk-00001.jsonl.gz").write_bytes(good[:-5] + b"xxxxx")
    assert [e["i"] for e in answers.read_chunks(out)] == [0, 1, 2]  # the bad chunk is not read
    logs = []
    manifest = distill.generate_chunks(tiny, prompts, out, SETTINGS, batch_size=4, chunks=2, log=logs.append)
    assert any("chunk 1" in line and "sha256" in line for line in logs)
    assert (out / "chunk-00001.jsonl.gz").read_bytes() == good  # regenerated, byte for byte (gzip without a time)
    assert len(manifest["chunks"]) == 2


def test_stops_at_max_tokens_and_refuses_other_settings(tmp_path, tiny):
    prompts, out = prompt_file(tmp_path), tmp_path / "out"
    manifest = distill.generate_chunks(tiny, prompts, out, SETTINGS, batch_size=4, max_tokens=1, log=lambda _: None)
    assert len(manifest["chunks"]) == 1  # the first chunk already holds >= 1 answer token
    with pytest.raises(answers.DistillError, match="max_new_tokens=4, not 8"):
        distill.generate_chunks(tiny, prompts, out, {**SETTINGS, "max_new_tokens": 8}, log=lambda _: None)


def test_read_prompt_rows(tmp_path):
    rows = distill.read_prompt_rows(prompt_file(tmp_path, 3))
    assert rows[1] == {"id": "p1", "category": "math", "prompt": "8 9 10"}
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"prompt": "hello"}\n\n{"id": 5, "prompt": "there"}\n')
    assert distill.read_prompt_rows(plain) == [{"id": "1", "category": "-", "prompt": "hello"},
                                               {"id": "5", "category": "-", "prompt": "there"}]
    plain.write_text('{"text": "no prompt"}\n')
    with pytest.raises(answers.DistillError, match="has no 'prompt' text"):
        distill.read_prompt_rows(plain)


@pytest.mark.parametrize("extra,message", [
    (["--batch-size", "0"], "batch-size=0 is out of range"),
    (["--chunks", "many"], "chunks='many' is not an integer"),
    (["--max-tokens", "-3"], "max-tokens=-3 is out of range"),
    (["--max-new-tokens", "5000"], "max-new-tokens=5000 is out of range"),
    (["--dtype", "int3"], "dtype='int3' is unknown"),
    (["--attention", "rowwise"], "attention='rowwise' is not usable for batched generation"),
    (["--target", "no-such-model"], "model spec 'no-such-model' is unknown"),
])
def test_distill_cli_bad_values_one_line(tmp_path, capsys, extra, message):
    code = main(["distill", "--prompts", str(prompt_file(tmp_path)), "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_distill_cli_bad_prompt_file(tmp_path, capsys):
    assert main(["distill", "--prompts", str(tmp_path / "none.jsonl.gz"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.count("\n") == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["distill", "--prompts", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bad.jsonl:1 is not valid JSON" in capsys.readouterr().err


def test_answer_batch_matches_generate():
    """Rows leaving the batch when they finish change nothing: the same greedy answers as model.generate on
    each prompt alone, whatever the batch size."""
    tiny = tiny_model(0, eos=46)  # a token these prompts' answers reach early or never
    prompts = [[1, 2, 3], [5, 9, 12, 40, 41, 7, 8], [60], [33, 34, 35, 36], [2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
               [17, 18], [44, 45, 46, 47, 48, 49], [9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [62, 61]]
    for n in (1, 6, 20):
        alone = [answer.answer_batch_generate(tiny, [p], n, pad=0)[0] for p in prompts]
        assert answer.answer_batch_generate(tiny, prompts, n, pad=0) == alone
        assert answer.answer_batch(tiny, prompts, n, pad=0) == alone
        rows = [{"id": str(i), "category": "-", "prompt": " ".join(map(str, p))} for i, p in enumerate(prompts)]
        for batch in (1, 3, 4):
            assert [e["answer_ids"] for e in distill.answer_chunk(tiny, rows, n, batch)] == alone
        if n == 20:
            assert any(len(a) < 6 for a in alone) and any(len(a) == 20 for a in alone)  # both kinds of ending


def test_distill_cli_on_real_target(tmp_path, capsys):
    """python -m specviz distill end to end: the real target answers 3 prompts (4 tokens each) in 2 chunks; the
    manifest names the GGUF file and the settings; a rerun does nothing."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"q{i}", "category": c, "prompt": p}) for i, (c, p) in enumerate([
        ("math", "What is 2 + 3?"), ("writing", "Write a haiku about rain."), ("qa", "Name a planet.")])) + "\n")
    args = ["distill", "--prompts", str(prompts), "--out", str(tmp_path / "out"), "--max-new-tokens", "4",
            "--chunk-size", "2", "--batch-size", "2", "--dtype", "bfloat16"]  # the bench's sdpa reference model
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "chunk 1 of 2 done: 1 prompts" in printed and "tok/s" in printed
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["gguf_file"].endswith(".gguf") and manifest["attention"] == "sdpa"
    assert [c["dtype"] for c in manifest["chunks"]] == ["bfloat16"] * 2 and "dtype" not in manifest
    assert manifest["totals"]["prompts"] == 3 and 3 <= manifest["totals"]["answer_tokens"] <= 12
    assert set(manifest["categories"]) == {"math", "writing", "qa"}
    rows = answers.read_chunks(tmp_path / "out")
    assert [r["id"] for r in rows] == ["q0", "q1", "q2"]
    tokenizer = models.get("smollm2-135m", torch.device("cpu"), torch.bfloat16, attention="sdpa").tokenizer
    assert "haiku about rain" in tokenizer.decode(rows[1]["prompt_ids"])
    assert main(args) == 0 and "2 chunks already done" in capsys.readouterr().out


def test_dtype_is_recorded_per_chunk(tmp_path, tiny):
    """A folder written with one dtype goes on in another (both are the target's greedy answers); each chunk
    records its own, a folder from before that (one dtype at the top) keeps its chunks, and totals count by dtype."""
    prompts, out = prompt_file(tmp_path), tmp_path / "out"
    distill.generate_chunks(tiny, prompts, out, SETTINGS, batch_size=2, chunks=1, log=lambda _: None)
    legacy = json.loads((out / "manifest.json").read_text())
    for entry in legacy["chunks"]:
        del entry["dtype"]
    (out / "manifest.json").write_text(json.dumps({**legacy, "dtype": "float32"}))
    manifest = distill.generate_chunks(tiny, prompts, out, {**SETTINGS, "dtype": "bfloat16"}, batch_size=2, chunks=2,
                                       log=lambda _: None)
    assert [c["dtype"] for c in manifest["chunks"]] == ["float32", "bfloat16"] and "dtype" not in manifest
    by = manifest["totals"]["answer_tokens_by_dtype"]
    assert set(by) == {"float32", "bfloat16"} and sum(by.values()) == manifest["totals"]["answer_tokens"]
    assert by["float32"] == manifest["chunks"][0]["answer_tokens"]


def test_workers_share_a_folder(tmp_path, tiny):
    """Two workers on one folder: each chunk is answered once, and the manifest holds every worker's chunks."""
    import threading

    prompts, out = prompt_file(tmp_path), tmp_path / "out"
    settings = {**SETTINGS, "chunk_size": 1}
    logs: list[list[str]] = [[], []]
    workers = [threading.Thread(target=distill.generate_chunks, args=(tiny, prompts, out, settings),
                                kwargs={"batch_size": 1, "log": logs[k].append}) for k in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    manifest = answers.read_manifest(out)
    assert [c["index"] for c in manifest["chunks"]] == list(range(7)) and manifest["totals"]["prompts"] == 7
    answered = [line.split()[1] for part in logs for line in part if " done: " in line]
    assert sorted(answered, key=int) == [str(i) for i in range(7)]  # no chunk twice
    assert not list(out.glob("*.claim"))  # claims released


def test_live_claim_is_skipped_and_stale_claim_taken_over(tmp_path, tiny):
    import os
    import socket
    import subprocess
    import sys

    prompts, out = prompt_file(tmp_path), tmp_path / "out"
    out.mkdir()
    host = socket.gethostname()
    (out / "chunk-00001.claim").write_text(json.dumps({"pid": os.getpid(), "host": host}))  # a live worker
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / "chunk-00002.claim").write_text(json.dumps({"pid": int(gone.stdout), "host": host}))  # a dead one
    manifest = distill.generate_chunks(tiny, prompts, out, SETTINGS, batch_size=3, log=lambda _: None)
    assert [c["index"] for c in manifest["chunks"]] == [0, 2]
    assert (out / "chunk-00001.claim").exists() and not (out / "chunk-00002.claim").exists()
