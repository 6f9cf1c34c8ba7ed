"""A room at once (issue 43): N concurrent `/race` clients (the real gradio_client) against the real app (`python
app.py` in its own process, as deployed) on this machine's cores, with a CPU-bound process beside it, while a
headless Chromium loads the page every few seconds. Reports how many answered, whether each answer equals its solo
run (taken first, without the load), the clients' latency, and the page's load times.

    .venv/bin/python experiments/probes/room.py --clients 64 --tokens 24 > experiments/results/room-64.txt
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Why is the sky blue?", "Name three primary colours.", "Write a haiku about the sea.",
           "What is 7 times 8?", "Give one tip for sleeping well.", "Translate 'good morning' into Spanish.",
           "Which planet is called the red planet?", "Repeat: red green blue, red green blue."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int) -> subprocess.Popen:
    env = dict(os.environ, GRADIO_SERVER_PORT=str(port))
    app = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    for line in app.stdout:  # the app prints its lines, then gradio its URL
        if "Running on" in line:
            threading.Thread(target=lambda: [None for _ in app.stdout], daemon=True).start()  # keep draining
            return app
    raise RuntimeError(f"the app exited with {app.wait()} before serving")


def page_loads(url: str, stop: threading.Event, out: list[float], every: float) -> None:
    """Load the page in a fresh Chromium page every `every` seconds until `stop`: seconds to a usable Run button."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        while not stop.is_set():
            page = browser.new_page()
            start = time.perf_counter()
            try:
                page.goto(url, timeout=120_000)
                page.wait_for_selector("#run", timeout=120_000)
                out.append(time.perf_counter() - start)
            except Exception as exc:  # noqa: BLE001  (reported as a failed load)
                out.append(float("inf"))
                print(f"# page load failed: {type(exc).__name__}", flush=True)
            page.close()
            stop.wait(every)
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--hog", type=int, default=1, help="CPU-bound processes beside the app (default 1)")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between page loads")
    args = ap.parse_args()
    import gradio_client

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    app = start_app(port)
    hogs: list[subprocess.Popen] = []
    try:
        solo = {}
        for prompt in PROMPTS:  # each prompt alone first, no load
            c = gradio_client.Client(url, verbose=False)
            solo[prompt] = c.predict(prompt=prompt, max_new_tokens=args.tokens, api_name="/race")
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hog)]
        results: dict[int, tuple[str, float, object]] = {}
        loads: list[float] = []
        stop = threading.Event()
        loader = threading.Thread(target=page_loads, args=(url, stop, loads, args.every))
        loader.start()

        def client(i: int) -> None:
            prompt = PROMPTS[i % len(PROMPTS)]
            start = time.perf_counter()
            try:
                out = gradio_client.Client(url, verbose=False).predict(prompt=prompt, max_new_tokens=args.tokens,
                                                                      api_name="/race")
                same = (out["ar_text"], out["spec_text"]) == (solo[prompt]["ar_text"], solo[prompt]["spec_text"])
                results[i] = ("same" if same else "different", time.perf_counter() - start, None)
            except Exception as exc:  # noqa: BLE001  (reported)
                results[i] = ("failed", time.perf_counter() - start, type(exc).__name__)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        stop.set()
        loader.join()
    finally:
        for h in hogs:
            h.kill()
        app.terminate()
        app.wait(timeout=30)
    kinds = [r[0] for r in results.values()]
    latency = sorted(r[1] for r in results.values())
    failures = sorted({r[2] for r in results.values() if r[2]})
    finite = [x for x in loads if x != float("inf")]
    print(f"# {args.clients} concurrent /race clients, {args.tokens} tokens each, {args.hog} CPU-bound process(es) "
          f"beside the app ({os.cpu_count()} CPUs); wall {wall:.0f} s")
    print(f"answered {kinds.count('same') + kinds.count('different')}/{args.clients}; equal to their solo run "
          f"{kinds.count('same')}; failed {kinds.count('failed')} {failures or ''}")
    print(f"latency p50 {statistics.median(latency):.1f} s, p95 {latency[int(0.95 * (len(latency) - 1))]:.1f} s, "
          f"max {latency[-1]:.1f} s")
    print(f"page loads during the run: {len(loads)}, to a usable Run button: max "
          f"{max(finite) if finite else float('nan'):.2f} s, median {statistics.median(finite) if finite else 0:.2f} s,"
          f" failed {len(loads) - len(finite)}")


if __name__ == "__main__":
    main()
