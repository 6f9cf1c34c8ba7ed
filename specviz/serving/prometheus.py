"""A serving engine's Prometheus /metrics page -> speculative-decoding figures, and windows between two scrapes.

Names drift between engines and versions, so they are matched loosely: a sample's engine prefix (`vllm:`,
`llamacpp:`, `sglang:`, `specviz:`, `trtllm_`) and a counter's `_total` are stripped, and the rest is matched
against the patterns below. Names these patterns were checked against (docs/serving.md):
- vLLM (vllm/v1/spec_decode/metrics.py): counters `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
  `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos{position}` (one series per engine label, summed here);
  gauge `vllm:num_requests_running`; counter `vllm:generation_tokens`.
- llama.cpp (`llama-server --metrics`): `llamacpp:spec_decode_*_total` with the same suffixes,
  `llamacpp:requests_processing`, `llamacpp:tokens_predicted_total`.
- SGLang (python/sglang/srt/metrics/collector.py): gauges `sglang:spec_accept_length`, `sglang:spec_accept_rate`,
  `sglang:num_running_reqs`; counter `sglang:generation_tokens`.
- TensorRT-LLM (its docs): `trtllm_spec_decode_num_draft_tokens_total`, `trtllm_spec_decode_num_accepted_tokens_total`,
  gauge `trtllm_spec_decode_acceptance_length` (no drafts counter: τ comes from the gauge).
- specviz's own export: the vLLM suffixes under `specviz:`.

Over a window between two scrapes (vLLM's definitions): τ = 1 + Δaccepted / Δdrafts (tokens per drafted step, the
bonus token included), draft acceptance = Δaccepted / Δdraft_tokens, acceptance at position i = Δper_pos[i] / Δdrafts.
Gauges are averaged over the window, not differenced. Torch-free.
"""
from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Optional

from specviz import metrics as leviathan

ENGINES = ("vllm", "llamacpp", "sglang", "trtllm", "specviz")
MIN_SUPPORT = 20            # drafts that must reach a position before the verdict reads its α_i
COLLAPSE_TAU = 1.1          # τ below this over a watch: speculation has collapsed (almost nothing accepted)
TIMEOUT = 5.0               # seconds for one HTTP request to a server's /metrics
MAX_BYTES = 8 << 20         # the largest /metrics page (or API answer) read

# canonical key -> the name (engine prefix and _total stripped) that fills it, matched whole
COUNTERS = {
    "drafts": r"spec_decode_num_drafts",
    "draft_tokens": r"spec_decode_(?:num_)?draft(?:ed)?_tokens",
    "accepted_tokens": r"spec_decode_(?:num_)?accepted_tokens",
    "generated_tokens": r"generation_tokens|tokens_predicted",
}
SPEC_COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")
PER_POSITION = r"spec_decode_num_accepted_tokens_per_pos"
POSITION_LABELS = ("position", "pos", "token_position")
GAUGES = {
    "requests_running": r"num_requests_running|requests_processing|num_running_reqs",
    "accept_length": r"spec_accept_length|spec_decode_acceptance_length",
    "accept_rate": r"spec_accept_rate|spec_decode_draft_acceptance_rate",
}
SPEC_GAUGES = ("accept_length", "accept_rate")


class ServerError(Exception):
    """A server that cannot be read or says something unusable; str(exc) is one line naming the URL or value."""


class Unreachable(ServerError):
    """No answer at all: the connection failed or timed out."""


@dataclass(frozen=True)
class Snapshot:
    engine: str                     # "vllm" | "llamacpp" | "sglang" | "trtllm" | "specviz" | "unknown"
    t: float                        # time.monotonic() when scraped
    counters: dict[str, float]      # canonical keys: "drafts", "draft_tokens", "accepted_tokens" (absent if not
                                    # exported), "generated_tokens"
    per_position: dict[int, float]  # accepted tokens per draft position (counter), {} if not exported
    gauges: dict[str, float]        # "requests_running", "accept_length", "accept_rate" (sglang, trtllm)
    names: tuple[str, ...]          # the metric names recognised (to report which names were found)

    @property
    def speculative(self) -> bool:
        """Does the page export any speculative-decoding figure?"""
        return any(k in self.counters for k in SPEC_COUNTERS) or any(k in self.gauges for k in SPEC_GAUGES)


def _split(name: str) -> tuple[str, str]:
    """`vllm:spec_decode_num_drafts_total` -> ("vllm", "spec_decode_num_drafts")."""
    prefix, colon, base = name.partition(":")
    if not colon:
        prefix, base = ("trtllm", name[len("trtllm_"):]) if name.startswith("trtllm_") else ("", name)
    return prefix, base.removesuffix("_total")


def _kind(base: str, table: dict[str, str]) -> Optional[str]:
    return next((key for key, pattern in table.items() if re.fullmatch(pattern, base)), None)


def _snippet(text: str) -> str:
    line = next((s for s in text.splitlines() if s.strip()), "")
    return repr(line[:60] + ("…" if len(line) > 60 else ""))


def parse(text: str, t: Optional[float] = None) -> Snapshot:
    """Prometheus text exposition -> Snapshot; ServerError when it is not Prometheus text or holds no metrics.
    Series of one name with different labels (vLLM's per-engine label, SGLang's dp/tp ranks) are summed for
    counters and the running requests, and averaged for the acceptance gauges; per-position counters are summed per
    position."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, and IndexError/KeyError on some garbage
        raise ServerError(f"the page is not Prometheus text ({type(exc).__name__}); it begins {_snippet(text)}") \
            from None
    samples = [s for f in families for s in f.samples if not s.name.endswith("_created") and math.isfinite(s.value)]
    if not samples:
        raise ServerError(f"the page holds no Prometheus samples; it begins {_snippet(text)}")
    counters: dict[str, float] = {}
    per_position: dict[int, float] = {}
    gauge_sums: dict[str, list[float]] = {}
    names: set[str] = set()
    spec_prefixes: Counter[str] = Counter()
    prefixes: Counter[str] = Counter()
    for s in samples:
        prefix, base = _split(s.name)
        prefixes[prefix] += 1
        if re.fullmatch(PER_POSITION, base):
            label = next((s.labels[k] for k in POSITION_LABELS if k in s.labels), None)
            if label is None or not label.isdigit():
                continue
            per_position[int(label)] = per_position.get(int(label), 0.0) + s.value
            names.add(s.name)
            spec_prefixes[prefix] += 1
        elif kind := _kind(base, COUNTERS):
            counters[kind] = counters.get(kind, 0.0) + s.value
            names.add(s.name)
            if kind in SPEC_COUNTERS:
                spec_prefixes[prefix] += 1
        elif kind := _kind(base, GAUGES):
            gauge_sums.setdefault(kind, []).append(s.value)
            names.add(s.name)
            if kind in SPEC_GAUGES:
                spec_prefixes[prefix] += 1
    gauges = {k: sum(v) if k == "requests_running" else sum(v) / len(v) for k, v in gauge_sums.items()}
    known = [p for p, _ in (spec_prefixes or prefixes).most_common() if p in ENGINES]
    return Snapshot(engine=known[0] if known else "unknown", t=time.monotonic() if t is None else t,
                    counters=counters, per_position=dict(sorted(per_position.items())), gauges=gauges,
                    names=tuple(sorted(names)))


def base_url(url: str) -> str:
    """The server's root from what the user gave (`http://host:port`, with or without /metrics or /v1)."""
    u = str(url).strip()
    if not re.match(r"https?://[^/\s]+", u):
        raise ServerError(f"url={url!r} is not an http(s) URL: give e.g. http://127.0.0.1:8080")
    u = u.rstrip("/")
    for tail in ("/metrics", "/v1"):
        u = u.removesuffix(tail)
    return u


def metrics_url(url: str) -> str:
    """GET target of a scrape: url itself when it ends in /metrics, else url + /metrics."""
    root = base_url(url)  # checks it is an http(s) URL
    given = str(url).strip().rstrip("/")
    return given if given.endswith("/metrics") else root + "/metrics"


def http(method: str, url: str, timeout: float = TIMEOUT, max_bytes: int = MAX_BYTES,
         json: Optional[dict] = None) -> tuple[int, bytes]:
    """One HTTP request: (status, body). ServerError, one line naming the URL, when it cannot connect, times out
    (`timeout` for the whole answer), or the answer is larger than max_bytes."""
    import httpx

    deadline = time.monotonic() + timeout
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            with client.stream(method, url, json=json) as response:
                size = response.headers.get("content-length")
                if size and size.isdigit() and int(size) > max_bytes:
                    raise ServerError(f"{url} answered {int(size)} bytes, over the cap of {max_bytes}")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise ServerError(f"{url} answered more than {max_bytes} bytes, over the cap")
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("deadline")
                return response.status_code, bytes(body)
    except httpx.TimeoutException:
        raise Unreachable(f"{url} did not answer within {timeout:g} s") from None
    except httpx.ConnectError as exc:
        raise Unreachable(f"cannot connect to {url}: {_reason(exc)}") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ServerError(f"{url}: {type(exc).__name__}: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:160] if text else type(exc).__name__


def scrape(url: str, timeout: float = TIMEOUT, max_bytes: int = MAX_BYTES) -> Snapshot:
    """GET <url>/metrics (or url as given if it ends in /metrics) and parse it."""
    target = metrics_url(url)
    status, body = http("GET", target, timeout, max_bytes)
    if status != 200:
        hint = (": start the server with its metrics on (llama-server --metrics, SGLang --enable-metrics)"
                if status in (404, 501) else "")
        raise ServerError(f"{target} answered HTTP {status}{hint}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ServerError(f"{target} is not Prometheus text (not UTF-8)") from None
    try:
        return parse(text)
    except ServerError as exc:
        raise ServerError(f"{target}: {exc}") from None


def no_speculation(url: str, snap: Snapshot) -> str:
    """The one line for a page that exports no speculative-decoding figure."""
    return (f"{metrics_url(url)} exports no speculative-decoding counters (engine {snap.engine}; recognised: "
            f"{', '.join(snap.names) or 'none'}): serve with speculation on (vLLM --speculative-config, llama-server "
            "--spec-type or -md, SGLang --speculative-algorithm)")


@dataclass(frozen=True)
class Window:
    """One interval between two snapshots: counters differenced, gauges averaged."""
    t0: float
    t1: float
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    tau: Optional[float]              # 1 + accepted/drafts; None when no drafts in the window (or from the gauge)
    acceptance_rate: Optional[float]  # accepted/draft_tokens (or the accept-rate gauge)
    per_position: list[float]         # Δ accepted at position i / Δ drafts (vLLM's per-position rate)
    requests_running: Optional[float]
    reset: bool                       # counters went backwards: a server restart; this window counts from zero
    generated_tokens: Optional[float] = None    # Δ generated tokens, where the engine exports them
    tokens_per_forward: Optional[float] = None  # generated / (generated − accepted): tokens per target forward

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    def to_dict(self) -> dict:
        return asdict(self)


def _mean_gauge(a: Snapshot, b: Snapshot, key: str) -> Optional[float]:
    values = [s.gauges[key] for s in (a, b) if key in s.gauges]
    return sum(values) / len(values) if values else None


def window(prev: Snapshot, cur: Snapshot) -> Window:
    """The window between two snapshots of one server. A counter that went backwards means a restart: the window
    then counts from zero (the new values)."""
    keys = set(prev.counters) | set(cur.counters)
    reset = any(cur.counters.get(k, 0.0) < prev.counters.get(k, 0.0) for k in keys) or any(
        cur.per_position.get(i, 0.0) < v for i, v in prev.per_position.items())
    base, base_pos = ({}, {}) if reset else (prev.counters, prev.per_position)
    delta = {k: cur.counters[k] - base.get(k, 0.0) for k in cur.counters}
    drafts, drafted, accepted = (delta.get(k, 0.0) for k in SPEC_COUNTERS)
    positions = range(max(cur.per_position) + 1) if cur.per_position else range(0)
    per_position = [(cur.per_position.get(i, 0.0) - base_pos.get(i, 0.0)) / drafts if drafts > 0 else 0.0
                    for i in positions]
    running = _mean_gauge(prev, cur, "requests_running")
    busy = running is None or running > 0  # gauges of an idle server hold stale values
    tau = 1.0 + accepted / drafts if drafts > 0 else None
    if tau is None and "drafts" not in cur.counters and busy:
        gauge = _mean_gauge(prev, cur, "accept_length")
        tau = gauge if gauge and gauge > 0 else None
    rate = accepted / drafted if drafted > 0 else None
    if rate is None and "draft_tokens" not in cur.counters and busy:
        rate = _mean_gauge(prev, cur, "accept_rate")
    generated = delta.get("generated_tokens")
    per_forward = (generated / (generated - accepted) if generated is not None and generated > accepted > 0
                   else None)
    return Window(prev.t, cur.t, drafts, drafted, accepted, tau, rate, per_position, running, reset, generated,
                  per_forward)


def conditional(per_position: list[float]) -> list[Optional[float]]:
    """vLLM's per-position rates (share of drafts that kept position i) -> α_i = P(i kept | positions before it
    kept), DESIGN's per-position acceptance. Biased low where drafts are shorter than γ (n-gram modes)."""
    out, before = [], 1.0
    for rate in per_position:
        out.append(rate / before if before > 0 else None)
        before = rate
    return out


@dataclass
class Watch:
    """Snapshots of one server, one after another -> windows, a summary and a verdict."""
    gamma: Optional[int] = None        # the engine's γ (drafted tokens per step); None: inferred
    collapse_tau: float = COLLAPSE_TAU
    cost_ratio: float = 0.0            # c for the prediction: 0 = drafting is free (n-gram), an upper bound
    series: list[Window] = field(default_factory=list)
    first: Optional[Snapshot] = None
    last: Optional[Snapshot] = None
    engine: str = "unknown"
    names: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)  # scrapes that failed during the watch, one line each
    drafter: Optional[str] = None      # what drafts on the server: "ngram", a model drafter's name, None: unknown

    def add(self, snap: Snapshot) -> Optional[Window]:
        """The window since the previous snapshot (None for the first)."""
        self.names |= set(snap.names)
        if snap.engine != "unknown":
            self.engine = snap.engine
        prev, self.last = self.last, snap
        if prev is None:
            self.first = snap
            return None
        w = window(prev, snap)
        self.series.append(w)
        return w

    def engine_gamma(self) -> tuple[Optional[int], str]:
        """γ and where it came from: given, the number of positions the engine exports, or the mean draft length."""
        if self.gamma:
            return self.gamma, "given"
        if self.last is not None and self.last.per_position:
            return max(self.last.per_position) + 1, "positions exported"
        drafts = sum(w.drafts for w in self.series)
        if drafts > 0:
            return max(1, round(sum(w.draft_tokens for w in self.series) / drafts)), "mean draft length"
        return None, "unknown"

    def summary(self) -> dict:
        s = self.series
        drafts, drafted, accepted = (sum(getattr(w, k) for w in s) for k in SPEC_COUNTERS)
        seconds = self.last.t - self.first.t if self.first is not None and self.last is not None else 0.0
        n = max((len(w.per_position) for w in s), default=0)
        per_position = [sum(w.per_position[i] * w.drafts for w in s if i < len(w.per_position)) / drafts
                        if drafts > 0 else 0.0 for i in range(n)]
        tau = 1.0 + accepted / drafts if drafts > 0 else _weighted([(w.tau, w.seconds) for w in s])
        rate = accepted / drafted if drafted > 0 else _weighted([(w.acceptance_rate, w.seconds) for w in s])
        generated = sum(w.generated_tokens for w in s) if s and all(w.generated_tokens is not None for w in s) \
            else None
        gamma, gamma_from = self.engine_gamma()
        out = {
            "engine": self.engine, "seconds": seconds, "windows": len(s), "drafts": drafts, "draft_tokens": drafted,
            "accepted_tokens": accepted, "acceptance_rate": rate, "tau": tau, "per_position": per_position,
            "per_position_conditional": conditional(per_position),
            "generated_tokens": generated,
            "tokens_per_forward": generated / (generated - accepted) if generated and generated > accepted > 0
            else None,
            "draft_tokens_per_s": drafted / seconds if seconds > 0 else None,
            "accepted_tokens_per_s": accepted / seconds if seconds > 0 else None,
            "requests_running": _weighted([(w.requests_running, w.seconds) for w in s]),
            "resets": sum(w.reset for w in s), "failed_scrapes": list(self.failures),
            "gamma": gamma, "gamma_from": gamma_from, "cost_ratio": self.cost_ratio,
            "names": sorted(self.names),
        }
        # Leviathan's α is per token along a chain; the engine's rate also counts the drafts after a refusal, so
        # at that rate the formula's τ fell below the measured one (0.18 at γ 3: 1.22 against τ 1.54, served EAGLE-3)
        out["alpha_per_token"] = leviathan.alpha_for_tau(tau, gamma) if tau is not None and gamma else None
        out["predicted_speedup"] = (leviathan.predicted_speedup(out["alpha_per_token"], gamma, self.cost_ratio)
                                    if out["alpha_per_token"] is not None else None)
        out["verdict"] = self._verdict(out)
        return out

    def predicted_speedup(self) -> Optional[float]:
        """Leviathan et al.'s speedup at the per-token α that gives the measured τ, the engine's γ and cost_ratio."""
        return self.summary()["predicted_speedup"]

    def verdict(self) -> str:
        """One line: idle, few drafts, collapsed or healthy, and the shape of α_i by position (shape_verdict)."""
        return self.summary()["verdict"]

    def _verdict(self, s: dict) -> str:
        f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        if not s["drafts"] and s["tau"] is None:
            return f"idle: no drafts in {s['seconds']:.0f} s (no traffic, or speculation is off)"
        over = f"over {s['drafts']:.0f} drafts" if s["drafts"] else f"over {s['seconds']:.0f} s (the engine's gauges)"
        if 0 < s["drafts"] < MIN_SUPPORT:  # a watch that caught the end of one request judges nothing
            return (f"few drafts: τ={f(s['tau'])}, draft acceptance {f(s['acceptance_rate'])} {over}, too few to "
                    f"judge (at least {MIN_SUPPORT}: watch while traffic runs)")
        if s["tau"] is not None and s["tau"] < self.collapse_tau:
            return (f"collapsed: τ={s['tau']:.2f} < {self.collapse_tau:g} {over}, draft acceptance "
                    f"{f(s['acceptance_rate'])}: the output stays correct but speculation does not pay")
        line = f"healthy: τ={f(s['tau'])}, draft acceptance {f(s['acceptance_rate'])} {over}"
        # α_i over the positions judged often enough (MIN_SUPPORT drafts reached them): past them a handful of
        # drafts gives 0 or 1, noise a verdict must not read as a trend
        reached = [s["drafts"]] + [share * s["drafts"] for share in s["per_position"][:-1]]
        alphas = [a for a, n in zip(s["per_position_conditional"], reached) if a is not None and n >= MIN_SUPPORT]
        if len(alphas) >= 2:
            line += "; " + shape_verdict(alphas, self.drafter)
        return line


FLAT = 0.02  # α_i within this of each other: flat


def shape(alphas: list[float]) -> str:
    """"flat", "rises", "falls" or "not monotone": the shape of α_i over the positions."""
    steps = [b - a for a, b in zip(alphas, alphas[1:])]
    if max(alphas) - min(alphas) <= FLAT:
        return "flat"
    if all(d >= -FLAT for d in steps):
        return "rises"
    if all(d <= FLAT for d in steps):
        return "falls"
    return "not monotone"


def shape_verdict(alphas: list[float], drafter: Optional[str] = None) -> str:
    """α_i's shape by position, judged against what the drafter kind leads one to expect. A chain's conditional
    acceptance may rise (the drafts that survive the first positions sit in easy, predictable spans) or fall (a
    model drafter's own errors compound; EAGLE's features drift from the target's); an n-gram copy, once kept, is
    usually kept to its end, so its α_i rises or stays flat after the first position."""
    shown = " ".join(f"{a:.2f}" for a in alphas)
    form = shape(alphas)
    said = {"flat": "α_i is flat by position", "rises": "α_i rises by position", "falls": "α_i falls by position",
            "not monotone": "α_i is not monotone by position"}[form] + f" ({shown})"
    if drafter is None:
        return said + " (give the drafter kind to judge it)"
    if drafter == "ngram":
        if form in ("flat", "rises"):
            return said + ": as expected for an n-gram copy (once kept, a copy usually runs on)"
        if form == "falls":
            return said + ": unusual for an n-gram copy (its copies break early: short repeats)"
        return said + ": not monotone for an n-gram copy, which should keep running once kept"
    a_drafter = ("an " if drafter[:1].lower() in "aeiou" else "a ") + drafter
    weak = next((i for i, a in enumerate(alphas[1:], 1) if a < 0.5 * alphas[0]), None)
    if weak is not None:
        return (said + f": position {weak} keeps under half of position 0's rate: drafting past position "
                f"{weak - 1} rarely pays for {a_drafter} drafter (try γ={weak})")
    if form == "not monotone":
        return said + f": not monotone, unusual for {a_drafter} chain (rising or falling are both normal)"
    return said + f": normal for {a_drafter} chain (" + (
        "surviving drafts sit in easy spans)" if form == "rises" else
        "its own errors compound)" if form == "falls" else "each position as likely as the last)")


def _weighted(pairs: list[tuple[Optional[float], float]]) -> Optional[float]:
    pairs = [(v, w) for v, w in pairs if v is not None]
    total = sum(w for _, w in pairs)
    if not pairs:
        return None
    return sum(v * w for v, w in pairs) / total if total > 0 else sum(v for v, _ in pairs) / len(pairs)
