"""What several tabs share, defined once: the device queue, the draft model and γ choices, the tabs' CSS,
key-figure cards, the verdict box and number formatting. No Gradio here."""
from __future__ import annotations

import html
from typing import Iterable, Optional

import gradio as gr

from specviz import methods, paths
from specviz.config import DEFAULT_DRAFT, DEFAULT_TARGET, GAMMA_MAX
from specviz.ui.logic import waiting

DEVICE_QUEUE = "cpu"  # the app's one queue worker for its one device: races, checks and steps never overlap
DRAFT_CHOICES = [DEFAULT_DRAFT, DEFAULT_TARGET]
MAX_NEW_TOKENS = 1024  # the length sliders' top (the deployment's policy may cap runs lower)
GAMMAS = ["auto"] + [str(g) for g in range(1, GAMMA_MAX + 1)]  # γ's choices: adaptive, or a fixed count


def at_hand(names: Iterable[str], target: str = DEFAULT_TARGET) -> list[str]:
    """The methods of `names` a visitor can run: every untrained one, and a trained one only where a drafter is
    shipped for the target the trained drafters are tied to (a method whose drafter is still to be trained, as
    DFlash's is, stays off the menus: `python -m specviz train NAME` makes one, and --drafter runs it)."""
    return [n for n in names if not methods.spec(n).trained or paths.shipped_drafter(target, n).is_dir()]


TABS_CSS = """
.sv-intro { font-size: 16px; color: #333; margin: 0; }
.sv-verdict { font-size: 21px; font-weight: 700; padding: 12px 16px; border-radius: 10px; }
.sv-verdict-ok { background: #e0f3ec; color: #00573f; border: 2px solid #009E73; }
.sv-verdict-bad { background: #fdeee6; color: #8a3300; border: 2px solid #D55E00; }
.sv-verdict-idle { background: #f2f6fa; color: #123; border: 1px solid #d0d0d0; font-weight: 500; font-size: 17px; }
.sv-table { border-collapse: collapse; font-size: 17px; margin: 4px 0; font-variant-numeric: tabular-nums; }
.sv-table th, .sv-table td { border-bottom: 1px solid #e2e2e2; padding: 5px 12px; text-align: left; }
.sv-table th { color: #444; font-weight: 600; background: #fafafa; }
.sv-table td.num { text-align: right; font-family: ui-monospace, 'DejaVu Sans Mono', monospace; }
.sv-table .sv-tok { font-family: ui-monospace, 'DejaVu Sans Mono', monospace; font-size: 17px; }
.sv-rule { font-size: 16px; color: #333; margin: 6px 0 2px 0; }
.sv-steptext { font-family: ui-monospace, 'DejaVu Sans Mono', monospace; font-size: 18px; line-height: 1.75;
  white-space: pre-wrap; word-break: break-word; border: 1px solid #d0d0d0; border-radius: 10px; padding: 10px 14px;
  background: #fff; min-height: 60px; max-height: 220px; overflow-y: auto; }
"""


def counted(n: int, noun: str) -> str:
    """'1 token', '2 tokens': a count and its noun (a regular plural)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def finish_words(reason: Optional[str], tokens: int) -> str:
    """Why a run ended, in words: it reached its token limit, or the model ended its answer (events' finish_reason:
    "length" or "eos")."""
    return {"length": f"reached {counted(tokens, 'token')}", "eos": "the model ended its answer"}.get(reason or "",
                                                                                                       "finished")


def tab_intro(text: str) -> str:
    """A tab's opening paragraph (HTML), with the tabs' CSS."""
    return f"<style>{TABS_CSS}</style><p class='sv-intro'>{text}</p>"


def choices_with_default(first: str, rest: list[str]) -> list[str]:
    """A dropdown's choices with this machine's default first."""
    return [first] + [c for c in rest if c != first]


def num(value: Optional[float], spec: str = ".2f", prefix: str = "") -> str:
    """A figure as the tabs print it: `prefix` and `value` in format `spec`, or – when there is none."""
    return "–" if value is None else prefix + format(value, spec)


def card(key: str, value: str, note: str = "") -> str:
    """One key figure: its name, its value and a note saying what it counts (data-metric: the name)."""
    return (f'<div class="sv-card" data-metric="{html.escape(key)}"><div class="sv-card-k">{html.escape(key)}</div>'
            f'<div class="sv-card-v">{html.escape(value)}</div><div class="sv-card-n">{html.escape(note)}</div></div>')


def cards_html(cards: Iterable[tuple[str, str, str]]) -> str:
    """Key figures as a row of cards, alone in a summary box."""
    return '<div class="sv-summary"><div class="sv-cards">' + "".join(card(*c) for c in cards) + "</div></div>"


def verdict_html(message: str, kind: str) -> str:
    """The verdict box: kind ok (green), bad (orange) or idle (grey)."""
    return f'<div class="sv-verdict sv-verdict-{kind}">{html.escape(message)}</div>'


def status_html(message: str, kind: str = "info") -> str:
    return f'<div class="sv-status sv-status-{kind}">{html.escape(message)}</div>'


QUEUED = "Waiting for the device: it runs one race at a time, from any visitor or tab; this one starts when it is free."


def queued(live) -> tuple:
    """Run's click, before the queue: the session's ticket (logic.waiting) and a status saying the race waits for
    the device (its first view replaces it at once where the device is free); a click mid-race changes nothing."""
    ticket = waiting(live)
    return ticket, gr.update() if ticket is live else status_html(QUEUED)


def never_ran(live) -> dict:
    """What a race stopped while it waited for the device shows, from Stop and again from its handler when the queue
    reaches it (logic.waited_out): the status says so; `live` stays the stopped ticket."""
    return {"status": status_html("■ stopped before it started: it was still waiting for the device, and nothing "
                                  "ran"), "live": live}


def into_view_js(status: str, panes: str) -> str:
    """A Run click's front-end step: where the race's panes start below the screen (a projector at 150%: 683 x 512
    CSS pixels, the header and the form fill it), the page scrolls its status line to the top, the panes under it."""
    return (f"() => {{ const p = document.querySelector('#{panes}'), s = document.querySelector('#{status}'); "
            f"if (p && s && p.getBoundingClientRect().top + 120 > window.innerHeight) "
            f"s.scrollIntoView({{behavior: 'smooth', block: 'start'}}); }}")


def method_info(names: Iterable[str]) -> str:
    """A method list's info line, by family, from the registry: "vanilla: a draft model · pld: prompt lookup · ..."."""
    by_family: dict[str, list[str]] = {}
    for name in names:
        by_family.setdefault(methods.spec(name).family, []).append(name)
    label = {"draft model": "a draft model", "lookup": "prompt lookup", "trained": "trained drafters"}
    return " · ".join(f"{', '.join(names)}: {label.get(family, family)}" for family, names in by_family.items())
