"""Self-distillation data: prompts this project writes, answered by the target itself.

The drafters learn the target's own distribution, so the training text is the target's greedy answers
to many varied prompts (writing, coding, math, summarization, translation, QA, retrieval-style). Only
the token ids are kept (a few hundred KB, committed under assets/), so the target's features can be
recomputed anywhere. Spec-Bench (our evaluation set) is never used.

Generation is resumable: finished examples are appended to a JSONL file, and a rerun skips them.
Reading the answers back (example files, chunk folders, the committed set) is specviz/core/answers.py's.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from specviz import prompts as prompts_file
from specviz.core.answers import (
    MANIFEST,
    DistillError,
    is_example_file,
    read_examples,
    read_manifest,
    sha256_file,
    verified_chunks,
)
from specviz.paths import TRAIN_PROMPTS
from specviz.train.answer import answer_batch, answer_batch_generate, pad_id


def read_prompt_file(path: str) -> list[str]:
    """A user's own domain data: JSONL with `prompt` or `turns`/`text`, or plain text with one prompt a line."""
    try:
        return [r["prompt"] for r in prompts_file.read(path)]
    except prompts_file.PromptFileError as exc:
        raise DistillError(str(exc)) from None


@torch.inference_mode()
def generate_answers(target, prompts: list[str], out_path: Path, max_new_tokens: int = 160, batch_size: int = 16,
                     progress: Callable[[int, int, int], None] | None = None) -> None:
    """Answer each prompt greedily with the target in batches, appending {"i", "prompt_ids", "answer_ids"}
    lines to out_path; prompts already there are skipped (resume)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = {row["i"] for row in read_examples(out_path)} if out_path.exists() else set()
    todo = [i for i in range(len(prompts)) if i not in done]
    todo.sort(key=lambda i: len(prompts[i]))  # similar lengths batch with little padding
    pad = pad_id(target)
    n_tokens = 0
    for start in range(0, len(todo), batch_size):
        chunk = todo[start:start + batch_size]
        encoded = [target.encode_prompt(prompts[i]) for i in chunk]
        with open(out_path, "a", encoding="utf-8") as f:
            for i, e, answer in zip(chunk, encoded, answer_batch_generate(target, encoded, max_new_tokens, pad)):
                n_tokens += len(answer)
                f.write(json.dumps({"i": i, "prompt_ids": e, "answer_ids": answer}) + "\n")
        if progress:
            progress(len(done) + start + len(chunk), len(prompts), n_tokens)


def pack(src: Path, dst: Path) -> None:
    """The committed form: examples sorted by index, gzipped."""
    rows = sorted(read_examples(src), key=lambda r: r["i"])
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt", encoding="utf-8", compresslevel=9) as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


HELD_OUT_EVERY = 20  # every 20th example, by index, is held out (5%)


def check_prompt_files(files: list[str]) -> None:
    """Training's data files, before the target loads: DistillError when a prompt file has no prompts, or when the
    data is prompt files only and holds fewer than HELD_OUT_EVERY (none would be held out)."""
    prompt_files = [f for f in files if not Path(f).is_dir() and not is_example_file(f)]
    n_prompts = sum(len(read_prompt_file(f)) for f in prompt_files)
    if files and len(prompt_files) == len(files) and n_prompts < HELD_OUT_EVERY:
        raise DistillError(f"data={', '.join(files)!r} has {n_prompts} prompts: training holds out every "
                           f"{HELD_OUT_EVERY}th answer to score on, so give at least {HELD_OUT_EVERY}")


def split(examples: list[dict], every: int = HELD_OUT_EVERY) -> tuple[list[dict], list[dict]]:
    """A fixed train / held-out split by example index (every 20th example is held out)."""
    return ([e for e in examples if e["i"] % every != every - 1], [e for e in examples if e["i"] % every == every - 1])


def split_for_training(examples: list[dict]) -> tuple[list[dict], list[dict]]:
    """split(), DistillError when either side is empty (training scores and measures on the held-out side)."""
    train, held = split(examples)
    if not train or not held:
        raise DistillError(f"the data gives {len(examples)} examples, {len(held)} of them held out (every "
                           f"{HELD_OUT_EVERY}th): training needs at least {HELD_OUT_EVERY} examples")
    return train, held


def sequences(examples: list[dict]) -> Iterator[list[int]]:
    for e in examples:
        yield list(e["prompt_ids"]) + list(e["answer_ids"])


# ---------------------------------------------------------------------------------------------------------
# Self-distillation at scale: the shared prompt set, answered in chunks (resumable, with a manifest)
#
# The prompt file (../shared/data/prompts/train_prompts.jsonl.gz, 40,724 prompts from permissively licensed
# public sets; attribution in LICENSES/) is cut into chunks of CHUNK_SIZE prompts in file order. Chunk c is
# written once complete as OUT/chunk-0000c.jsonl.gz, one line per example {"id", "category", "prompt_ids",
# "answer_ids"} in file order, and OUT/manifest.json is rewritten after every chunk with its sha256, counts and
# timing. A rerun skips the chunks whose file matches the manifest's sha256 and regenerates the others, so a
# killed (or SIGSTOPped) run loses at most the chunk in progress.
#
# Several workers (processes, e.g. one per core with one thread each) can share one folder: a worker claims a
# chunk by creating OUT/chunk-0000c.claim (exclusive create, holding its pid and host) and skips chunks that
# another live worker has claimed; a claim whose process is gone is taken over. Every manifest update happens
# under a lock on OUT/manifest.lock and merges into the manifest as it is on disk, so no worker's chunk is lost.
# ---------------------------------------------------------------------------------------------------------

SHARED_PROMPTS = TRAIN_PROMPTS
CHUNK_SIZE = 256
# The configuration `python -m specviz distill` uses by default: the fastest batched greedy generation measured
# (PROBE below, recorded in the manifest, holds the figures). On the 2-core AVX2 machine bf16 loses: without native
# bf16 torch emulates its matmuls row by row, and the row kernel (specviz/models/kernels/rowwise_linear.c, built for
# verifying a few rows bitwise) comes close but not ahead. On a CPU with native bf16 (AMX) bf16 wins, most at batch 64.
def default_dtype() -> str:
    """bfloat16 where the CPU computes it natively (AMX, AVX512-BF16), float32 elsewhere (see PROBE)."""
    from specviz.models import loader as models
    return "bfloat16" if models.native_bf16() else "float32"


DEFAULT_BATCH = {"float32": 32, "bfloat16": 64}
PROBE = {
    "machine": "AMD EPYC (AVX2, no native bf16), 2 cores shared with other jobs; torch 2.13 CPU",
    "workload": "smollm2-135m, attention sdpa, greedy; answer tokens (cut at EOS) per second of wall time, or "
                "per CPU-second of the process (tok_per_s_cpu: robust to other jobs and SIGSTOP); prompts: the first "
                "N of the shared file, sorted by length (the batch-16 pair: prompts 256-319)",
    "results": [
        {"dtype": "float32", "matmul": "torch", "threads": 2, "batch": 8, "loop": "generate", "prompts": 8,
         "max_new_tokens": 32, "tok_per_s_wall": 4.5, "note": "the other core busy with tests"},
        {"dtype": "bfloat16", "matmul": "torch", "threads": 2, "batch": 8, "loop": "generate", "prompts": 8,
         "max_new_tokens": 32, "tok_per_s_wall": 2.3, "note": "the other core busy with tests"},
        {"dtype": "bfloat16", "matmul": "specviz row kernel", "threads": 2, "batch": 8, "loop": "generate",
         "prompts": 8, "max_new_tokens": 32, "tok_per_s_wall": 1.0, "note": "the other core busy with tests"},
        {"dtype": "float32", "matmul": "torch", "threads": 2, "batch": 32, "loop": "generate", "prompts": 32,
         "max_new_tokens": 32, "tok_per_s_wall": 5.2, "note": "the other core busy with tests"},
        {"dtype": "float32", "matmul": "torch", "threads": 1, "batch": 32, "loop": "generate", "prompts": 32,
         "max_new_tokens": 128, "tok_per_s_cpu": 18.5},
        {"dtype": "float32", "matmul": "torch", "threads": 1, "batch": 32, "loop": "finished rows leave",
         "prompts": 32, "max_new_tokens": 128, "tok_per_s_cpu": 20.5},
        *({"dtype": "float32", "matmul": "torch", "threads": 1, "batch": b, "loop": "finished rows leave",
           "prompts": max(32, b), "max_new_tokens": 64, "tok_per_s_cpu": r} for b, r in ((8, 16.1), (16, 19.7),
                                                                                       (32, 18.5), (64, 19.5))),
        {"dtype": "bfloat16", "matmul": "specviz row kernel", "threads": 1, "batch": 32,
         "loop": "finished rows leave", "prompts": 32, "max_new_tokens": 64, "tok_per_s_cpu": 17.1},
        {"dtype": "bfloat16", "matmul": "torch", "threads": 1, "batch": 32, "loop": "finished rows leave",
         "prompts": 32, "max_new_tokens": 64, "tok_per_s_cpu": 4.7},
        {"dtype": "float32", "matmul": "torch", "threads": 1, "batch": 16, "loop": "finished rows leave",
         "prompts": 64, "max_new_tokens": 96, "tok_per_s_cpu": 31.4},
        {"dtype": "float32", "matmul": "torch", "threads": 1, "batch": 16, "prompts": 64, "max_new_tokens": 96,
         "loop": "continuous batching (waiting prompts join as rows finish; not kept: +3.5% for cache surgery)",
         "tok_per_s_cpu": 32.5, "identical_answers": "64/64"},
        *({"machine": "Intel Xeon with AMX-BF16, 2 cores, the other core idle", "dtype": d, "matmul": "torch",
           "threads": 1, "batch": b, "loop": "finished rows leave", "prompts": b, "max_new_tokens": 256,
           "first_prompt": 12800, "tok_per_s_cpu": r} for d, b, r in (("float32", 32, 56.1), ("bfloat16", 32, 99.5),
                                                                    ("bfloat16", 64, 116.9))),
    ],
    "choice": "float32 at batch 32 without native bf16, bfloat16 at batch 64 with it; sdpa, finished rows leave the "
              "batch, 1 thread (two threads stall each other "
              "while another job holds a core: a 32x576x1536 matmul ran at 23 GFLOP/s on 1 thread, 9 on 2)",
}
# what makes two runs' chunks interchangeable: a rerun with other values is refused (use another --out). The dtype
# and the batch size are not among them but recorded per chunk: both are the target's greedy answers, which differ
# only after a near-tie (bf16 answers also depend on the batch: 9 of 32 answers were identical at batch 32 and 64,
# 6 of 32 between fp32 and bf16, on the PROBE's AMX prompts).
SETTINGS_KEYS = ("target", "gguf_file", "attention", "max_new_tokens", "greedy", "chunk_size",
                 "prompts_sha256")


def read_prompt_rows(path: str | Path) -> list[dict]:
    """The rows of a JSONL prompt file (gzipped when it ends in .gz), in file order: {"id", "category",
    "prompt"} with string ids and categories (specviz.prompts.read)."""
    try:
        rows = prompts_file.read(path, jsonl_only=True, fields=("prompt",))
    except prompts_file.PromptFileError as exc:
        raise DistillError(str(exc)) from None
    return [{"id": str(r["id"]), "category": str(r["category"]), "prompt": r["prompt"]} for r in rows]


def chunk_file(index: int) -> str:
    return f"chunk-{index:05d}.jsonl.gz"


def write_gzip_lines(path: Path, rows: list[dict]) -> None:
    """Compact JSON lines, gzip level 9 with no name or time in the header (same rows, same bytes), written to
    a temporary file first and moved into place, so a chunk file is either complete or absent."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as f:
        for r in rows:
            f.write((json.dumps(r, separators=(",", ":")) + "\n").encode("utf-8"))
    os.replace(tmp, path)


@contextlib.contextmanager
def manifest_lock(out_dir: Path) -> Iterator[None]:
    """Exclusive access to OUT/manifest.json among the workers sharing the folder (flock; a no-op where the
    platform has no fcntl, so one worker per folder there)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(out_dir / "manifest.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def claim_file(index: int) -> str:
    return f"chunk-{index:05d}.claim"


def _claim_owner_alive(path: Path) -> bool:
    """Whether the worker named in a claim file still runs (same host: its pid exists; another host's claim
    counts as alive, it cannot be checked from here)."""
    try:
        owner = json.loads(path.read_text(encoding="utf-8"))
        pid, host = int(owner["pid"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return False  # unreadable or half-written by a worker that died: stale
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)  # PermissionError: it exists, under another user
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def claim(out_dir: Path, index: int) -> bool:
    """Claim chunk `index` for this process; False when another live worker holds it. A stale claim (its
    process gone) is replaced."""
    path = out_dir / claim_file(index)
    mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _claim_owner_alive(path):
                return False
            path.unlink(missing_ok=True)  # stale: take it over
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(mine)
        return True
    return False


def release(out_dir: Path, index: int) -> None:
    (out_dir / claim_file(index)).unlink(missing_ok=True)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def answer_chunk(target, rows: list[dict], max_new_tokens: int, batch_size: int,
                 progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """The examples of one chunk, in the rows' order. Prompts are batched by token length (short with short)
    so batches carry little padding. progress(done prompts, answer tokens) after each batch."""
    pad = pad_id(target)
    encoded = [target.encode_prompt(r["prompt"]) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: (len(encoded[i]), i))
    answers: dict[int, list[int]] = {}
    tokens = 0
    for start in range(0, len(order), batch_size):
        part = order[start:start + batch_size]
        for i, answer in zip(part, answer_batch(target, [encoded[i] for i in part], max_new_tokens, pad)):
            answers[i] = answer
            tokens += len(answer)
        if progress:
            progress(len(answers), tokens)
    return [{"id": r["id"], "category": r["category"], "prompt_ids": encoded[i], "answer_ids": answers[i]}
            for i, r in enumerate(rows)]


def _totals(manifest: dict) -> None:
    """Recompute the manifest's totals and per-category counts from its chunk entries."""
    chunks = manifest["chunks"]
    prompt_tokens = sum(c["prompt_tokens"] for c in chunks)
    answer_tokens = sum(c["answer_tokens"] for c in chunks)
    size = sum(c["bytes"] for c in chunks)
    seconds = sum(c["seconds"] for c in chunks)
    manifest["totals"] = {
        "chunks": len(chunks), "prompts": sum(c["prompts"] for c in chunks), "prompt_tokens": prompt_tokens,
        "answer_tokens": answer_tokens, "hit_max_new_tokens": sum(c["hit_max_new_tokens"] for c in chunks),
        "bytes": size, "bytes_per_token": round(size / (prompt_tokens + answer_tokens), 4) if chunks else None,
        "bytes_per_answer_token": round(size / answer_tokens, 4) if answer_tokens else None,
        "seconds": round(seconds, 1), "answer_tok_per_s": round(answer_tokens / seconds, 2) if seconds else None,
        "answer_tokens_by_dtype": {d: sum(c["answer_tokens"] for c in chunks if c["dtype"] == d)
                                   for d in sorted({c["dtype"] for c in chunks})},
    }
    categories: dict[str, dict] = {}
    for c in chunks:
        for name, counts in c["categories"].items():
            into = categories.setdefault(name, {"prompts": 0, "answer_tokens": 0})
            into["prompts"] += counts["prompts"]
            into["answer_tokens"] += counts["answer_tokens"]
    manifest["categories"] = dict(sorted(categories.items()))


def _answer_one_chunk(target, rows: list[dict], index: int, size: int, settings: dict, batch_size: int,
                      out_dir: Path, log: Callable[[str], None]) -> dict:
    """Answer chunk `index`, write its file, and return its manifest entry."""
    part = rows[index * size:(index + 1) * size]
    t0, c0 = time.perf_counter(), time.process_time()

    def progress(n: int, tokens: int) -> None:
        seconds = time.perf_counter() - t0
        log(f"  chunk {index}: {n}/{len(part)} prompts, {tokens} tokens, {seconds:.0f} s, {tokens / seconds:.1f} tok/s")

    examples = answer_chunk(target, part, int(settings["max_new_tokens"]), batch_size, progress)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    path = out_dir / chunk_file(index)
    write_gzip_lines(path, examples)
    answer_tokens = sum(len(e["answer_ids"]) for e in examples)
    prompt_tokens = sum(len(e["prompt_ids"]) for e in examples)
    categories: dict[str, dict] = {}
    for e in examples:
        into = categories.setdefault(e["category"], {"prompts": 0, "answer_tokens": 0})
        into["prompts"] += 1
        into["answer_tokens"] += len(e["answer_ids"])
    return {"index": index, "file": path.name, "prompts": len(examples), "first_id": examples[0]["id"],
            "prompt_tokens": prompt_tokens, "answer_tokens": answer_tokens,
            "hit_max_new_tokens": sum(len(e["answer_ids"]) >= int(settings["max_new_tokens"])
                                      and e["answer_ids"][-1] not in target.eos_ids for e in examples),
            "bytes": path.stat().st_size, "sha256": sha256_file(path), "seconds": round(seconds, 1),
            "cpu_seconds": round(cpu, 1), "tok_per_s": round(answer_tokens / seconds, 2),
            "dtype": settings["dtype"], "batch_size": batch_size, "threads": torch.get_num_threads(),
            "categories": dict(sorted(categories.items()))}


def generate_chunks(target, prompts_path: str | Path, out_dir: str | Path, settings: dict, batch_size: int = 32,
                    chunks: int | None = None, max_tokens: int | None = None,
                    log: Callable[[str], None] = print) -> dict:
    """Answer the prompt file chunk by chunk into out_dir (see the comment above); returns the manifest.

    settings: what the data depends on (SETTINGS_KEYS but the prompt file's sha256, which is computed here),
    plus anything else worth recording (e.g. the probe that chose the configuration). chunks: stop after the
    first N chunks of the file are done; max_tokens: stop once finished chunks hold at least M answer tokens.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = read_prompt_rows(prompts_path)
    size = int(settings["chunk_size"])
    wanted = {**settings, "prompts_sha256": sha256_file(prompts_path)}

    def current() -> dict:
        """The manifest as on disk (call under the lock), checked against this run's settings, with only the
        chunks whose files verify."""
        manifest = read_manifest(out_dir)
        if manifest is not None:
            differ = [k for k in SETTINGS_KEYS if manifest.get(k) != wanted.get(k)]
            if differ:
                k = differ[0]
                raise DistillError(f"{out_dir / MANIFEST} was made with {k}={manifest.get(k)!r}, not "
                                   f"{wanted.get(k)!r}: use the same settings or another --out")
        else:
            manifest = {"format": 1, **{k: wanted[k] for k in SETTINGS_KEYS}, "prompts_file": Path(prompts_path).name,
                        "prompts_total": len(rows), "chunks": []}
        for entry in manifest["chunks"]:  # folders written before the dtype was recorded per chunk
            entry.setdefault("dtype", manifest.get("dtype"))
        manifest.pop("dtype", None)
        done = verified_chunks(out_dir, manifest)
        for entry in manifest["chunks"]:
            if int(entry["index"]) not in done:
                log(f"chunk {entry['index']}: {entry['file']} is missing or its sha256 differs from the manifest: "
                    "redoing it")
        manifest["chunks"] = [done[i] for i in sorted(done)]
        _totals(manifest)
        return manifest

    with manifest_lock(out_dir):
        manifest = current()
        manifest.update({k: v for k, v in wanted.items() if k not in (*SETTINGS_KEYS, "dtype")})  # latest run's extras
        manifest["batch_size"] = batch_size
        write_json(out_dir / MANIFEST, manifest)
    n_chunks = (len(rows) + size - 1) // size
    last = n_chunks if chunks is None else min(chunks, n_chunks)
    log(f"{len(rows)} prompts in {n_chunks} chunks of {size}; {len(manifest['chunks'])} chunks already done "
        f"({manifest['totals']['answer_tokens']} answer tokens)")
    for index in range(last):
        with manifest_lock(out_dir):
            manifest = read_manifest(out_dir) or manifest  # other workers' chunks count too
            done = {int(e["index"]) for e in manifest["chunks"]}
            if max_tokens is not None and manifest["totals"]["answer_tokens"] >= max_tokens:
                log(f"stopping: {manifest['totals']['answer_tokens']} answer tokens >= --max-tokens {max_tokens}")
                break
            if index in done or not claim(out_dir, index):
                continue
        try:
            entry = _answer_one_chunk(target, rows, index, size, settings, batch_size, out_dir, log)
        except BaseException:
            release(out_dir, index)
            raise
        with manifest_lock(out_dir):  # the claim goes only once the manifest lists the chunk
            manifest = current()
            manifest["chunks"] = sorted([*(e for e in manifest["chunks"] if e["index"] != index), entry],
                                        key=lambda e: e["index"])
            _totals(manifest)
            write_json(out_dir / MANIFEST, manifest)
            release(out_dir, index)
        t = manifest["totals"]
        log(f"chunk {index} of {n_chunks} done: {entry['prompts']} prompts, {entry['answer_tokens']} answer tokens in "
            f"{entry['seconds']:.0f} s = {entry['tok_per_s']:.1f} tok/s, "
            f"{entry['bytes'] / (entry['prompt_tokens'] + entry['answer_tokens']):.2f} bytes/token; "
            f"total {t['chunks']} chunks, {t['prompts']} prompts, {t['answer_tokens']} answer tokens, "
            f"{t['bytes']} bytes")
    return manifest
