"""`probe --local`: the drafter a server runs, run by specviz on the same prompts, beside the server's figures.

specviz runs the same drafter (ngram → prompt lookup with the engines' n-gram sizes; eagle, medusa, draft → the
drafter folder the export came from) on the same prompts through the same chat template, greedy, in a chain of the same
length (γ), in the served dtype (fp32, the export's), and counts acceptance by position as vLLM does: accepted at
position i / drafting steps. `compare` puts the two side by side and names the largest gap and its likely cause.
Imports torch (the local run); the rest of serving/ does not.
"""
from __future__ import annotations

from typing import Callable

from specviz import methods
from specviz.serving import engines

AGREE = 0.05          # served and local acceptance at a position this close agree (issue 41's tolerance)
METHOD = {"ngram": "pld", "eagle": "eagle", "medusa": "medusa", "draft": "draft", "dflash": "dflash"}
TARGET = "smollm2-135m"  # the target the served exports come from, run here (and its vocabulary, checked first)


def run_local(rows: list[dict], drafter: str, gamma: int, max_new_tokens: int, dtype: str = "float32",
              log: Callable[[str], None] = print) -> dict:
    """Every prompt greedy through specviz with `drafter` in a chain of `gamma`: acceptance by position, the prompt
    length after the chat template, and the answer."""
    import torch

    from specviz.config import DecodeConfig
    from specviz.engines import session
    from specviz.events import Verdict
    from specviz.models import loader

    kind, folder = engines.drafter_kind(drafter)
    method = METHOD[kind]
    target = loader.get(TARGET, dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
    cfg = DecodeConfig(method=method, gamma=gamma, temperature=0.0, max_new_tokens=max_new_tokens,
                       pld_ngram_max=engines.NGRAM["max"], pld_ngram_min=engines.NGRAM["min"])
    drafts, accepted, prompts = 0, [0] * gamma, []
    for n, row in enumerate(rows):
        prepared = session.prepare(row["prompt"], cfg, target, str(folder) if folder else None, chain=True)
        mine, counts, ids = 0, [0] * gamma, []
        for event in prepared.spec_steps():
            ids += [t.token_id for t in event.emitted]
            chain = [d for d in event.drafts if d.depth < gamma]
            if not chain:
                continue
            mine += 1
            for d in chain:
                if d.verdict is Verdict.ACCEPTED:
                    counts[d.depth] += 1
        drafts += mine
        accepted = [a + c for a, c in zip(accepted, counts)]
        prompts.append({"id": row["id"], "prompt_tokens": len(prepared.prompt_ids), "completion_tokens": len(ids),
                        "text": target.decode(ids), "drafts": mine, "per_position_counts": counts})
        log(f"[local {n + 1}/{len(rows)}] {row['id']}: {mine} drafts, accepted by position {counts}")
    return {"drafter": drafter, "method": method, "gamma": gamma, "dtype": dtype, "drafts": drafts,
            "accepted_by_position": accepted,
            "per_position": [a / drafts if drafts else 0.0 for a in accepted], "prompts": prompts,
            "chat_template": "the target's own (tokenizer.apply_chat_template, add_generation_prompt)"}


def served_figures(data: dict) -> dict:
    """The probe's greedy requests: drafts, acceptance by position (accepted at i / drafts), prompt lengths."""
    greedy = [r for r in data["requests"] if r["mode"] == "greedy" and not r["error"]]
    g = data["by_mode"].get("greedy", {})
    return {"engine": data["engine"], "drafts": g.get("drafts"), "per_position": list(g.get("per_position") or []),
            "prompts": [{"id": r["id"], "prompt_tokens": r.get("prompt_tokens"), "text": r.get("text"),
                         "drafts": r.get("drafts")} for r in greedy]}


def served_weights(model: str | None) -> str:
    """What the server decodes with, as far as its model name tells: a GGUF's file name (its quantisation; the fp32
    export specviz serve gives llama.cpp holds the weights specviz decodes), else the server's dtype (specviz serve
    starts vLLM in float32)."""
    from specviz.serving.export_common import TARGET_GGUF

    if model and model.endswith(".gguf"):
        name = model.rsplit("/", 1)[-1]
        return f"the GGUF {name}" + (" (the same fp32 weights)" if name == TARGET_GGUF else "")
    return "the server's dtype (specviz serve: float32)"


def noise(served: dict, local: dict, i: int) -> float:
    """Two standard errors of the gap at position i: each side a share of its drafts (a binomial proportion)."""
    import math

    var = 0.0
    for side in (served, local):
        p, n = side["per_position"][i], side["drafts"] or 0
        var += p * (1 - p) / n if n else 0.25
    return 2 * math.sqrt(var)


def compare(served: dict, local: dict, dtype_served: str = "float32") -> dict:
    """Position by position: the gap, the largest one, and a one-line verdict with its likely cause."""
    s, m = served["per_position"], local["per_position"]
    n = min(len(s), len(m))
    gaps = [s[i] - m[i] for i in range(n)]
    by_id = {p["id"]: p for p in local["prompts"]}
    pairs = [(p, by_id.get(p["id"])) for p in served["prompts"] if p["id"] in by_id]
    template = [p["id"] for p, q in pairs
                if p["prompt_tokens"] is not None and p["prompt_tokens"] != q["prompt_tokens"]]
    differ = [p["id"] for p, q in pairs if p["text"] is not None and p["text"].strip() != q["text"].strip()]
    out = {"positions": n, "gaps": gaps, "template_differs": template, "answers_differ": differ,
           "largest": None, "agree": None}
    if not n:
        out["verdict"] = ("no comparison: the server exported no acceptance by position"
                          if not s else "no comparison: specviz drafted nothing locally")
        return out
    i = max(range(n), key=lambda k: abs(gaps[k]))
    out["largest"] = {"position": i, "served": s[i], "local": m[i], "gap": gaps[i]}
    out["agree"] = abs(gaps[i]) <= AGREE
    out["noise"] = noise(served, local, i)
    head = (f"largest gap at position {i}: served {s[i]:.3f}, local {m[i]:.3f} ({gaps[i]:+.3f}; "
            f"{served['drafts'] or 0:.0f} served and {local['drafts']} local drafts)")
    if not out["agree"]:
        head += f": they do not agree within {AGREE}" + (
            f", though the gap is within sampling noise at these counts (±{out['noise']:.2f}, two standard errors): "
            "probe more prompts to tell" if abs(gaps[i]) <= out["noise"] else "")
    template_line = (f"the chat template: {len(template)}/{len(pairs)} prompts have another length on the server (its "
                     "template or special tokens differ from the target's)")
    differ_line = (f"the greedy answers differ on {len(differ)}/{len(pairs)} prompts (weights: served {dtype_served}, "
                   f"local {local['dtype']}; or numerics), so the drafts are judged on other text")
    if out["agree"]:  # no gap to explain: what differs is said as a caveat
        cause = f"agree within {AGREE} at every position; " + (
            f"though {template_line}" if template else f"though {differ_line}" if differ
            else "same template, same answers")
    elif template:
        cause = f"likely cause: {template_line}"
    elif differ:
        cause = f"likely cause: {differ_line}"
    elif methods.spec(local["method"]).family == "lookup":
        cause = ("likely cause: the engine's n-gram rule differs from specviz's prompt lookup (which match it takes, "
                 "how short a continuation it proposes); same template, same answers")
    else:
        cause = ("likely cause: the drafter conversion or the engine's drafting (same template, same answers, same "
                 "dtype): check the export (`specviz export` compares logits)")
    out["verdict"] = f"{head}: {cause}"
    return out
