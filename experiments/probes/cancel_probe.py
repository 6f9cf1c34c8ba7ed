"""Does a cancelled or abandoned race still cost the next visitor? (issue 50, part 4)

The app is launched in-process on a free port with its /metrics route (as tests/conftest.py serves it). Then, on
one race setting: a solo /race timed; a /race submitted, cancelled (gradio_client's job.cancel()) once its first
tokens are counted, and the next /race timed right after; the same with a client process killed mid-run instead of a
cancel. Printed: each time, the next race over the solo one, and the most `specviz:num_requests_running` showed while
the next race ran (more than 1 means the abandoned run was still generating beside it).

    .venv/bin/python experiments/probes/cancel_probe.py --tokens 96
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PROMPT = "Write a short, cheerful poem about a lighthouse keeper who loves tea."
CLIENT = """
import sys
from gradio_client import Client
Client(sys.argv[1], verbose=False).predict(prompt=sys.argv[2], max_new_tokens=int(sys.argv[3]), api_name="/race")
"""


def metric(url: str, name: str) -> float:
    """The sum of one metric's samples in the app's /metrics text."""
    text = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf"^specviz:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def wait_for_tokens(url: str, before: float, timeout: float = 300.0) -> None:
    """Until the running race has emitted tokens past `before` (its first updates are out)."""
    end = time.perf_counter() + timeout
    while metric(url, "generation_tokens_total") <= before + 8:
        if time.perf_counter() > end:
            raise TimeoutError("the race emitted no tokens")
        time.sleep(0.05)


def timed_race(client, url: str, tokens: int) -> tuple[float, float]:
    """(seconds, the most requests running seen meanwhile) of one /race."""
    peak, done = [0.0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], metric(url, "num_requests_running"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    client.predict(prompt=PROMPT, max_new_tokens=tokens, api_name="/race")
    seconds = time.perf_counter() - start
    done.set()
    watcher.join()
    return seconds, peak[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=96, help="max new tokens of every race")
    ap.add_argument("--adopt", action="store_true", help="measure this machine first (app.warm_up's default race)")
    args = ap.parse_args()

    import torch
    from conftest import serving
    from gradio_client import Client

    import app
    from specviz import hardware
    from specviz.models import loader as models

    torch.set_num_threads(2)
    target = models.get("smollm2-135m")
    if args.adopt:
        hardware.adopt(target)
    print(f"CPU: {hardware.cpu_name()}; {args.tokens} tokens, default race {hardware.default_pair().race()}")
    with serving(app.build_ui(), **app.launch_options()) as url:
        client = Client(url, verbose=False)
        timed_race(client, url, args.tokens)  # warm-up: kernels picked, the drafter loaded
        solo, _ = timed_race(client, url, args.tokens)
        print(f"solo race: {solo:.2f} s")

        job = client.submit(prompt=PROMPT, max_new_tokens=args.tokens, api_name="/race")
        wait_for_tokens(url, metric(url, "generation_tokens_total"))
        job.cancel()
        after, peak = timed_race(client, url, args.tokens)
        print(f"after a cancel: {after:.2f} s = {after / solo:.2f}× solo; requests running at most {peak:g}")

        before = metric(url, "generation_tokens_total")
        proc = subprocess.Popen([sys.executable, "-c", CLIENT, url, PROMPT, str(args.tokens)])
        wait_for_tokens(url, before)
        proc.kill()
        proc.wait()
        after, peak = timed_race(client, url, args.tokens)
        print(f"after a killed client: {after:.2f} s = {after / solo:.2f}× solo; requests running at most {peak:g}")
        time.sleep(1.0)
        print(f"idle after: requests running {metric(url, 'num_requests_running'):g}")


if __name__ == "__main__":
    main()
