"""The guard between `specviz serve` and a serving engine: `python -m specviz.serving.guard ENGINE ARGV...`.

engines.Engine starts this in a new session (so it leads a process group of its own) with a pipe on its stdin; it
starts the engine in that group and stops the whole group (SIGTERM, then SIGKILL after GRACE seconds) when
- the pipe closes: `specviz serve` stopped or died, even by SIGKILL (the kernel closes its end), or
- it gets SIGTERM or SIGINT, or
- the engine exits (its own children, vLLM's engine core for one, go with it).
So no engine process outlives the command that started it. Torch-free and quick to import."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE = 15.0  # seconds between SIGTERM and SIGKILL


def stop_group(grace: float = GRACE, child: subprocess.Popen | None = None) -> None:
    """SIGTERM to this process group (the guard ignores it), wait for the engine, then SIGKILL the rest."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    group = os.getpgid(0)
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while child is not None and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the engine's children, a moment to go after it
    os.killpg(group, signal.SIGKILL)  # the guard too: nothing of the group is left


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m specviz.serving.guard ARGV...", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    done = threading.Event()

    def on_signal(*_):
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watch_parent():
        try:
            sys.stdin.buffer.read()  # returns at EOF: the parent closed the pipe or died
        except OSError:
            pass
        done.set()

    threading.Thread(target=watch_parent, daemon=True).start()
    while not done.is_set() and child.poll() is None:
        done.wait(0.2)
    code = child.poll()
    stop_group(child=child)
    return code if code is not None else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
