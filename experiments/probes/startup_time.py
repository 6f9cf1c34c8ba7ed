"""How long `python app.py` takes to answer, to finish a first race, and to be ready again with a kept calibration.

Two starts of app.py as a subprocess on a free port, what the app keeps between starts (the calibration and the GGUF
target converted once) in a fresh temporary folder (SPECVIZ_CACHE_DIR):
  cold: from the start to the port answering HTTP 200; to the first /race (gradio_client, 128 new tokens, submitted
        as soon as the port answers) done; to the log's "models ready" (the machine measured and its calibration kept);
  warm: the same cache (the calibration kept by the cold start): to the port answering, to "models ready".
With --image, the fresh folder first gets what the Dockerfile's build keeps in the image (its `RUN python -c ...`
line, run here into that folder): the cold start is then a container's first start.

    .venv/bin/python experiments/probes/startup_time.py [--tokens 128] [--app app.py] [--image]

Prints one line per figure, with the CPU and the load average (a shared machine's figures move with its load).
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def until(check, proc, deadline_s: float = 900.0) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"app.py exited ({proc.returncode}) or hung; see its log")
        time.sleep(0.1)


def start(app: str, cache: Path, log: Path) -> tuple[subprocess.Popen, str, float]:
    port = free_port()
    # all the app keeps between starts (the calibration, the GGUF target converted once) in the run's own folder
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "SPECVIZ_CACHE_DIR": str(cache),
           "SPECVIZ_CALIBRATION_DIR": str(cache)}
    env.pop("SPECVIZ_CALIBRATE", None)
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-u", app], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/", t0


def phases(log: Path) -> str:
    """The warm-up's phases from the app's log (its timestamped start-up lines): the models and the first short race,
    then settling the race (the calibration measured, or the kept one checked)."""
    stamps = {}
    for line in log.read_text().splitlines():
        if " INFO specviz.startup: " in line:
            when, what = line.split(" INFO specviz.startup: ", 1)
            t = datetime.datetime.strptime(when.strip(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            stamps.setdefault(what.split("…")[0].split(":")[0], t)
    first, check = stamps.get("loading the model smollm2-135m"), stamps.get("checking this machine's kept calibration")
    done = next((t for k, t in stamps.items() if k.startswith("ready")), None)
    if None in (first, check, done):
        return "phases: not found in the log"
    how = next((line.rsplit("; ", 1)[-1] for line in log.read_text().splitlines()
                if line.startswith("specviz: default race")), "?")  # hardware.adopt's line: where the figures came from
    return f"models and a first short race {check - first:.1f} s, settling the race {done - check:.1f} s: {how}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def image_warm_up(cache: Path) -> None:
    """Run the Dockerfile's build-time warm-up (its `RUN python -c "..."` line) with `cache` as the app's cache."""
    line = next((line for line in (ROOT / "Dockerfile").read_text().splitlines()
                 if line.startswith('RUN python -c "')), None)
    if line is None:
        raise SystemExit("the Dockerfile has no `RUN python -c` warm-up line")
    code = line.removeprefix('RUN python -c "').removesuffix('"')
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "SPECVIZ_CACHE_DIR": str(cache)})
    print(f"image: the Dockerfile's warm-up took {time.monotonic() - t0:.1f} s (at build time)", flush=True)


def run(app: str, tokens: int, image: bool) -> None:
    from gradio_client import Client

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    print(f"# {cpu}, {os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="specviz-startup-") as folder:
        cache, log = Path(folder) / "cache", Path(folder) / "app.log"
        ready = lambda: "models ready" in log.read_text()  # noqa: E731
        if image:
            image_warm_up(cache)
        proc, url, t0 = start(app, cache, log)
        try:
            until(lambda: answers(url), proc)
            port_s = time.monotonic() - t0
            print(f"cold: port answered {port_s:.1f} s", flush=True)
            result = Client(url, verbose=False).predict(prompt="Why is the sky blue?", max_new_tokens=tokens,
                                                        api_name="/race")
            race_s = time.monotonic() - t0
            print(f"cold: first {tokens}-token /race done {race_s:.1f} s "
                  f"({result['summary']['spec']['new_tokens'] if result.get('summary') else '?'} tokens; "
                  f"note: {result.get('note') or 'none'})", flush=True)
            until(ready, proc)
            print(f"cold: models ready {time.monotonic() - t0:.1f} s "
                  f"(calibration kept: {len(list(cache.glob('calibration-*.json')))} file; {phases(log)})", flush=True)
        finally:
            stop(proc)
        proc, url, t0 = start(app, cache, log)
        try:
            until(lambda: answers(url), proc)
            print(f"warm: port answered {time.monotonic() - t0:.1f} s", flush=True)
            until(ready, proc)
            kept = "from this machine's calibration" in log.read_text()
            print(f"warm: models ready {time.monotonic() - t0:.1f} s (from the kept calibration: {kept}; "
                  f"{phases(log)})", flush=True)
        finally:
            stop(proc)
    print(f"# load average at end {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128, help="max_new_tokens of the first race")
    ap.add_argument("--app", default="app.py", help="the app's script, relative to the repository")
    ap.add_argument("--image", action="store_true", help="start from what the Dockerfile's build keeps in the image")
    args = ap.parse_args()
    run(args.app, args.tokens, args.image)


if __name__ == "__main__":
    main()
