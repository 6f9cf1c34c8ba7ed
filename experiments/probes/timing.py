"""The median wall time of a call, for the probe scripts beside this file (run as
`.venv/bin/python experiments/probes/NAME.py`, which puts this folder on the import path)."""
import statistics
import time


def median_seconds(f, reps: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        f()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
