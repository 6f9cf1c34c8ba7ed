"""The watch's alarm: speculation that collapses is silent (the output stays correct, only slower), so `watch` and the
app's "Watch a server" tab raise a visible alarm when, over the last ALARM_WINDOWS windows between scrapes,

- τ stays near 1.0 (below prometheus.COLLAPSE_TAU: almost every drafted step keeps nothing), or
- draft acceptance has fallen under half of its start (the first ALARM_WINDOWS judged windows of the watch).

A window counts ("judged") when the engine drafted at least MIN_DRAFTS times in it, or, for an engine that exports
only gauges (SGLang, TensorRT-LLM), when it reports τ for it: an idle server raises nothing. A collapse that starts
at some scrape is alarmed at the ALARM_WINDOWS-th judged window after it. Torch-free.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from specviz.serving.prometheus import COLLAPSE_TAU, Window

ALARM_WINDOWS = 2   # windows the condition must hold over (and the start's length)
MIN_DRAFTS = 4      # drafts a window needs to be judged
HALVED = 0.5        # acceptance under this share of its start: halved


@dataclass(frozen=True)
class Alarm:
    kind: str         # "collapsed" (τ near 1) | "halved" (acceptance under half its start)
    line: str         # one line for a person
    t1: float         # the end (time.monotonic()) of the window that raised it

    def to_dict(self) -> dict:
        return asdict(self)


def _judged(w: Window) -> bool:
    return w.drafts >= MIN_DRAFTS or (w.drafts == 0 and w.tau is not None)


def _pooled(ws: Sequence[Window]) -> tuple[Optional[float], Optional[float]]:
    """(τ, draft acceptance) over windows: counters summed where the engine has them, else gauges averaged."""
    drafts, drafted, accepted = (sum(getattr(w, k) for w in ws) for k in ("drafts", "draft_tokens", "accepted_tokens"))
    taus = [w.tau for w in ws if w.tau is not None]
    rates = [w.acceptance_rate for w in ws if w.acceptance_rate is not None]
    tau = 1.0 + accepted / drafts if drafts > 0 else (sum(taus) / len(taus) if taus else None)
    rate = accepted / drafted if drafted > 0 else (sum(rates) / len(rates) if rates else None)
    return tau, rate


def alarm(series: Sequence[Window], windows: int = ALARM_WINDOWS,
          collapse_tau: float = COLLAPSE_TAU) -> Optional[Alarm]:
    """The alarm the watch raises now (None: none), from its windows so far."""
    judged = [w for w in series if _judged(w) and not w.reset]
    if len(judged) < windows:
        return None
    last = judged[-windows:]
    tau, rate = _pooled(last)
    seconds = last[-1].t1 - last[0].t0
    if tau is not None and tau < collapse_tau:
        return Alarm("collapsed", f"ALARM: τ stayed near 1.0 ({tau:.2f} < {collapse_tau:g}) over the last {windows} "
                                  f"windows ({seconds:.0f} s): speculation has collapsed, almost every draft is "
                                  "refused (the output stays correct, only slower)", last[-1].t1)
    if len(judged) < 2 * windows:
        return None
    _, start = _pooled(judged[:windows])
    if start and rate is not None and rate < HALVED * start:
        return Alarm("halved", f"ALARM: draft acceptance fell to {rate:.2f} over the last {windows} windows "
                               f"({seconds:.0f} s), under half of its start ({start:.2f})", last[-1].t1)
    return None
