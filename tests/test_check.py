"""The drafter check: statistics, compatibility, the verdict, a planted sampling bug, and reports on the real pair."""
import json
import math
import re
from pathlib import Path

import pytest
import torch
from tiny import TinyTokenizer

from specviz import metrics
from specviz.check import measure, misses_report, stats
from specviz.check import run as check
from specviz.check.options import CheckOptions
from specviz.cli.main import main
from specviz.config import DecodeConfig
from specviz.core import profile
from specviz.core.cache import CachedLM
from specviz.core.sampling import pick, warp
from specviz.engines.ar import AREngine
from specviz.engines.draft_model import ModelDrafter
from specviz.engines.speculative import Proposal
from specviz.metrics import CostProfile
from specviz.models.drafts import int8_copy
from specviz.models.loader import ModelError

ASSETS = Path(__file__).resolve().parent.parent / "assets"

TWO_PROMPTS = [{"id": "qa", "category": "qa", "prompt": "Name three colours of the rainbow."},
               {"id": "story", "category": "writing", "prompt": "Write one sentence about a cat."}]
FAST = dict(samples=200, max_new_tokens=16, synthetic_samples=300, profile_sizes=(1, 2, 4, 8), profile_reps=1,
            batch_sizes=(1, 2, 4))


# ── statistics ──────────────────────────────────────────────────────────────────────────────────────

def test_chi2_sf_matches_known_values():
    assert abs(stats.chi2_sf(3.841, 1) - 0.05) < 1e-3    # the 95% point of chi-square(1)
    assert abs(stats.chi2_sf(18.307, 10) - 0.05) < 1e-3  # ... of chi-square(10)
    assert stats.chi2_sf(math.inf, 3) == 0.0 and stats.chi2_sf(1.0, 0) == 1.0


def test_fit_pools_rare_tokens_and_flags_skew():
    p = torch.tensor([0.5, 0.3, 0.15, 0.03, 0.01, 0.01, 0.0])
    exact = stats.fit(p * 200, p)  # expected 100, 60, 30, 6, 2, 2: the two 2s pool (4 < 5) into the rarest bin
    assert exact.passed() and exact.p_value > 0.99 and exact.tv < 1e-6
    assert exact.bins == 4 and exact.dof == 3 and exact.bin_tokens[-1] == [3, 4, 5]
    skewed = stats.fit(torch.tensor([140.0, 40, 16, 2, 1, 1, 0]), p)
    assert not skewed.passed() and skewed.p_value < 1e-3
    impossible = stats.fit(torch.tensor([99.0, 60, 30, 6, 2, 2, 1]), p)
    assert impossible.impossible == 1 and not impossible.passed()


def test_synthetic_suite_passes_and_its_control_is_flagged():
    for case in stats.SYNTHETIC_CASES:
        result = stats.synthetic_case(case, 2000)
        assert result.ok, (case, result.fit)


def test_batch_model_reduces_to_leviathan_on_a_flat_profile():
    flat = CostProfile("cpu", "float32", "sdpa", 0, 1, [1, 64], [0.01, 0.01], [0.01, 0.01])
    for alpha, gamma, c in [(0.8, 4, 0.1), (0.5, 2, 0.3)]:
        assert abs(measure.speedup_at(alpha, gamma, c, 1, flat) - metrics.predicted_speedup(alpha, gamma, c)) < 1e-12
    # cost ∝ tokens
    linear = CostProfile("cpu", "float32", "sdpa", 0, 1, [1, 2, 4], [0.01, 0.02, 0.04], [0.01, 0.02, 0.04])
    assert measure.speedup_at(0.8, 4, 0.0, 1, linear) == pytest.approx(metrics.expected_tokens_per_step(0.8, 4) / 5)
    assert linear.time(8) == pytest.approx(0.08)  # linear beyond the largest size
    assert linear.ratio(4) == pytest.approx(4.0) and metrics.best_gamma(0.8, 0.0, linear, range(1, 5)) == 1
    assert metrics.profiled_speedup(0.8, 4, 0.1, flat) == pytest.approx(metrics.predicted_speedup(0.8, 4, 0.1))


# ── compatibility and the verdict on tiny models ────────────────────────────────────────────────────

def test_compatibility(target, tiny_target, tiny_draft):
    same = check.compare_tokenizers(tiny_target, tiny_draft)
    assert same.ok and same.overlap == 1.0 and same.special_mismatch == []
    pld = check.compare_tokenizers(tiny_target, None)
    assert pld.ok and not pld.draft_tokenizer and "no draft tokenizer" in pld.message
    refused = check.compare_tokenizers(target, tiny_target)
    assert not refused.ok and "incompatible tokenizers" in refused.message and "\n" not in refused.message
    with pytest.raises(ModelError, match="incompatible tokenizers"):
        check.run_check(target, ModelDrafter(tiny_target), draft=tiny_target, prompts=TWO_PROMPTS,
                        options=CheckOptions(**FAST))


def test_run_check_on_tiny_pair_reports_every_part(tiny_target, tiny_draft):
    seen = []
    prompts = [{"id": 1, "category": "a", "prompt": "1 2 3 4 5"}, {"id": 2, "category": "b", "prompt": "9 8 7 1 2 3"}]
    report = check.run_check(tiny_target, ModelDrafter(tiny_draft), draft=tiny_draft, prompts=prompts,
                             options=CheckOptions(**FAST), progress=lambda *a: seen.append(a))
    assert report.correct and report.verdict.startswith("correct; ") and "γ=4" in report.verdict
    assert [s for s in dict.fromkeys(stage for stage, _, _ in seen)] == list(check.STAGES)
    assert all(done == total for stage in check.STAGES for s, done, total in [max(x for x in seen if x[0] == stage)])
    d = json.loads(json.dumps(report.to_dict()))
    assert d["greedy"]["identical_all"] and d["fidelity"]["fit"]["n"] == 200
    assert {"alpha", "tau", "alpha_by_position", "cost_ratio", "speedup", "predicted_speedup", "best_gamma",
            "best_gamma_hw", "by_category", "gamma_curve", "profile", "batch_curve"} <= set(d["payoff"])
    assert [c["name"] for c in d["payoff"]["by_category"]] == ["a", "b"]
    fd = d["payoff"]["first_draft"]  # every step that drafted, split into repeats and new
    assert fd["repeat_steps"] + fd["new_steps"] > 0 and 0 <= fd["repeat_accepted"] <= fd["repeat_steps"]


def test_check_of_a_feature_drafter_conditions_on_the_prefill(tiny_target):
    """EAGLE's first step is the target's prefill (it drafts nothing): the sampling test counts the next step,
    over the seeds whose prefill emitted the target's most likely first token, against p(. | prompt, that token)."""
    from specviz.drafters import trained as drafters
    from specviz.drafters.config import DrafterConfig
    from specviz.engines.eagle import EagleDrafter

    cfg = DrafterConfig.for_target("eagle", tiny_target.name, tiny_target.model.config)
    torch.manual_seed(0)
    d = drafters.Drafter(drafters.build_module(cfg), cfg, tiny_target.model, None)
    prompts = [{"id": 1, "category": "a", "prompt": "1 2 3 4 5"}]
    report = check.run_check(tiny_target, EagleDrafter(d, "random eagle"), prompts=prompts,
                             options=CheckOptions(**FAST), method="eagle")
    fid = report.fidelity
    assert report.correct, report.verdict
    assert fid.given is not None and fid.samples == 200 and fid.seeds >= 200 and fid.with_drafts == 200
    ids = tiny_target.encode_prompt("1 2 3 4 5")
    first = int(CachedLM(tiny_target.model, tiny_target.device).logits(ids)[0].argmax())
    assert fid.given == tiny_target.text_of(first)


def test_a_real_greedy_divergence_is_a_bug_and_named(tiny_target):
    """Plant a divergence in a greedy output: the check names the position, its context, and calls it a bug
    (the tiny model's logits are far from a tie)."""
    ids = tiny_target.encode_prompt("1 2 3 4 5")
    ar = [t for t in AREngine(tiny_target).steps(ids, DecodeConfig(method="ar", max_new_tokens=8))]
    ar_ids = [e.emitted[0].token_id for e in ar]
    bad = ar_ids[:5] + [(ar_ids[5] + 1) % 60] + ar_ids[6:]
    div = measure.divergence(tiny_target, ids, ar_ids, bad, 1e-3)
    assert div.index == 5 and not div.near_tie and div.top2_gap > 1e-3
    assert div.context == "".join(f"<{t}>" for t in ar_ids[:5])
    cmp = metrics.compare(ar, ar, "vanilla", True)
    result = measure.PromptResult(1, "a", "p", len(ids), "", ar_ids, bad, False, div, cmp)
    fid = measure.Fidelity(1, 1.0, 1.0, 100, 0, 0, stats.fit(torch.tensor([100.0]), torch.tensor([1.0])), True, [])
    pay = measure.payoff([result], [ar], [ar], None, CheckOptions())
    correct, problems, verdict = check.conclude([result], fid, [], pay, CheckOptions())
    assert not correct and verdict.startswith("INCORRECT: greedy output differs from AR") and "token 5" in verdict


def test_a_correct_drafter_that_is_almost_never_kept_is_named_so(tiny_target):
    """A new user's pass: an undertrained drafter (α 0.00) read "correct; 0.59× (slower than specviz AR)", green,
    with nothing saying its guesses were never kept."""
    from dataclasses import replace

    ids = tiny_target.encode_prompt("1 2 3 4 5")
    ar = [t for t in AREngine(tiny_target).steps(ids, DecodeConfig(method="ar", max_new_tokens=8))]
    ar_ids = [e.emitted[0].token_id for e in ar]
    result = measure.PromptResult(1, "a", "p", len(ids), "", ar_ids, ar_ids, True, None,
                                  metrics.compare(ar, ar, "vanilla", True))
    fid = measure.Fidelity(1, 1.0, 1.0, 100, 0, 0, stats.fit(torch.tensor([100.0]), torch.tensor([1.0])), True, [])
    pay = measure.payoff([result], [ar], [ar], None, CheckOptions())
    for alpha, said in [(0.0, True), (0.04, True), (0.05, False), (None, False)]:
        correct, _, verdict = check.conclude([result], fid, [], replace(pay, alpha=alpha, speedup=0.59),
                                             CheckOptions())
        assert correct and verdict.startswith("correct; 0.59× (slower than specviz AR)"), verdict
        assert (f"the target kept {alpha or 0:.0%} of its guesses: is it trained for this target" in verdict) == said


# ── why it misses: a drafter planted to miss only after newlines ────────────────────────────────────

NEWLINES = frozenset(range(0, 64, 4))  # the tiny vocabulary's tokens that read as a line break here


class NewlineTokenizer(TinyTokenizer):
    """The tiny tokenizer, with every fourth token reading as a line break."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join("\n" if i in NEWLINES else f"<{i}>" for i in ids)


class MissesAfterNewline:
    """Drafts the target's own greedy token (it is the target), except right after a line break, where it drafts
    another token: a drafter that misses only after newlines."""
    name = "misses after newlines"

    def __init__(self, model):
        self.inner = ModelDrafter(model)

    def session(self, vocab_size, eos_ids):
        return _NewlineSession(self.inner.session(vocab_size, eos_ids))


class _NewlineSession:
    def __init__(self, inner):
        self.inner = inner

    def propose(self, tokens, gamma, cfg, generator):
        drafted = []
        while len(drafted) < gamma:
            best = int(self.inner.lm.logits(tokens, drafted)[0, :self.inner.vocab_size].argmax())
            drafted.append((best + 1) % self.inner.vocab_size if (list(tokens) + drafted)[-1] in NEWLINES else best)
        q = torch.nn.functional.one_hot(torch.tensor(drafted), self.inner.vocab_size).float()  # exact copies
        return Proposal(drafted, q, len(drafted))

    def rollback(self, n_valid):
        self.inner.rollback(n_valid)


def test_check_names_a_drafter_that_misses_after_newlines(tiny_target):
    """The check's "why it misses" names "after a newline" first (report, JSON, HTML): every refusal there, none
    elsewhere; the histogram, the near-tie share and both position curves are in the report."""
    from specviz.check import report as html_report
    from specviz.models.loader import LoadedModel

    model = LoadedModel("tiny-newlines", tiny_target.model, NewlineTokenizer(64, 63), tiny_target.device,
                        tiny_target.dtype)
    prompts = [{"id": 1, "category": "a", "prompt": "1 2 3 5"}, {"id": 2, "category": "b", "prompt": "9 7 1 2 3"}]
    options = CheckOptions(**{**FAST, "samples": 40, "max_new_tokens": 48, "synthetic_samples": 0})
    result = check.run_check(model, MissesAfterNewline(model), prompts=prompts, options=options)
    assert result.correct, result.verdict
    d = json.loads(json.dumps(result.to_dict()))
    why = d["misses"]
    first = why["contexts"][0]
    assert why["refusals"] > 3 and first["context"] == "after a newline", why["contexts"]
    assert first["refusals"] == why["refusals"] and first["miss_rate"] == 1.0  # it misses every one, and only those
    assert all(c["refusals"] == 0 for c in why["contexts"][1:]) and len(why["contexts"]) > 1
    assert all(t["context"] == "after a newline" for t in why["top_missed"]) and len(why["top_missed"]) <= 10
    assert sum(why["accepted_length"]) == why["steps"] and set(why["accepted_length_by_category"]) == {"a", "b"}
    assert why["near_ties"] + why["disagreements"] == why["refusals"] and why["gap_unknown"] == 0  # every top-2 kept
    pos = why["position"]
    assert len(pos["conditional"]) == len(pos["unconditional"]) == 4
    assert pos["conditional"][0] == pytest.approx(d["payoff"]["alpha_by_position"][0])
    html = html_report.to_html(d)
    part = html[html.index("4 · Why does it miss?"):]
    assert part.index("after a newline") < min(part.index(c) for c in ("start of a word", "start of the answer")
                                               if c in part)
    for label in ("Accepted length: steps that kept k drafts", "refusals at near ties", "Tokens it misses most",
                  "conditional", "unconditional"):
        assert label in part, label
    from specviz.check.report import figures
    from specviz.ui.check import check_figures_html

    tab = check_figures_html(d)  # the app's Check tab: the cards, then the tables
    assert "refusals at near ties" in tab and "missed most" in tab and 'id="check-misses"' in tab
    assert tab.index("after a newline") < tab.index("Tokens it misses most")
    figs = figures(d)
    assert {t.name for t in figs["alpha_position"].data} == {misses_report.CONDITIONAL, misses_report.UNCONDITIONAL}
    assert figs["accepted_length"] is not None and figs["gaps"] is not None


# ── the real pair ───────────────────────────────────────────────────────────────────────────────────

class GreedyDraftBug:
    """A planted bug (transformers once shipped it): draft the argmax but report the softmax as q."""

    def __init__(self, inner: ModelDrafter):
        self.inner, self.name = inner, f"greedy-draft bug({inner.name})"

    def session(self, vocab_size, eos_ids):
        return _BugSession(self.inner.session(vocab_size, eos_ids))


class _BugSession:
    def __init__(self, inner):
        self.inner = inner

    def propose(self, tokens, gamma, cfg, generator):
        drafted, qs = [], []
        while len(drafted) < gamma:
            q = warp(self.inner.lm.logits(tokens, drafted)[0, :self.inner.vocab_size], cfg)  # (V,)
            drafted.append(pick(q, True, generator))  # the bug: argmax even when sampling
            qs.append(q)
        return Proposal(drafted, torch.stack(qs), len(drafted))

    def rollback(self, n_valid):
        self.inner.rollback(n_valid)


def test_planted_sampling_bug_is_reported_incorrect(target):
    draft = int8_copy(target)
    opts = CheckOptions(**{**FAST, "synthetic_samples": 0})
    report = check.run_check(target, GreedyDraftBug(ModelDrafter(draft)), draft=draft, prompts=TWO_PROMPTS,
                             options=opts)
    assert report.prompts and all(r.identical for r in report.prompts)  # greedy cannot see this bug
    assert not report.fidelity.passed and report.fidelity.fit.p_value < 1e-3
    assert not report.correct and report.verdict.startswith("INCORRECT: sampling is not exact")


@pytest.mark.parametrize("which", [["--draft", "int8"], ["--method", "pld"], ["--method", "eagle"],
                                   ["--method", "draft"]])
def test_check_cli_reports_on_real_pair(target, tmp_path, capsys, which):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in TWO_PROMPTS) + "\n")
    out_json, out_html = tmp_path / "check.json", tmp_path / "check.html"
    code = main(["check", "--target", "smollm2-135m", *which, "--prompts", str(prompts), "--samples", "50",
                 "--max-new-tokens", "16", "--synthetic-samples", "300", "--json", str(out_json),
                 "--report", str(out_html), "--device", "cpu", "--dtype", "float32"])
    out = capsys.readouterr().out
    d = json.loads(out_json.read_text())
    assert code == 0 and d["correct"], d["verdict"]
    assert d["verdict"].startswith("correct; ") and f"verdict: {d['verdict']}" in out
    assert {"verdict", "correct", "problems", "environment", "options", "compatibility", "greedy", "fidelity",
            "synthetic", "payoff", "seconds"} <= set(d)
    assert d["greedy"]["identical_all"] and len(d["greedy"]["prompts"]) == 2
    assert d["fidelity"]["passed"] and d["fidelity"]["samples"] == 50
    assert (d["fidelity"]["given"] is not None) == (which == ["--method", "eagle"])  # EAGLE's first step is the prefill
    assert d["fidelity"]["engine"] == ("tree" if which == ["--method", "eagle"] else "chain")  # EAGLE's tree, as raced
    assert d["fidelity"]["with_drafts"] > 0
    assert d["compatibility"]["draft_tokenizer"] == (which[0] == "--draft")
    assert d["payoff"]["profile"]["tokens"] == list(profile.SIZES) and d["payoff"]["batch_curve"]
    fd = d["payoff"]["first_draft"]
    assert fd["repeat_steps"] + fd["new_steps"] > 0
    assert ("where the answer repeats its context" if fd["repeat_steps"] else "never repeated its context") in out
    # the shipped trained drafters compress their vocabulary; the others draft any token
    vocab = d["payoff"]["draft_vocab"]
    if which[0] == "--method" and which[1] != "pld":
        config = json.loads((ASSETS / "drafters" / f"smollm2-135m-{which[1]}" / "config.json").read_text())
        shipped = config["draft_vocab"]
        assert vocab["size"] == shipped and 0.5 < vocab["coverage"] <= 1.0
        assert f"draft vocabulary of {shipped} tokens holds {vocab['coverage']:.1%} of the target's tokens here" in out
    else:
        assert vocab is None and "draft vocabulary" not in out
    assert d["greedy"]["verify_logit_max_abs_diff"] < 1e-3 and d["greedy"]["judged_positions"] >= 16
    assert d["greedy"]["guarantee"] == "identical in practice" and d["environment"]["dtype"] == "float32"
    html = out_html.read_text()
    assert d["verdict"] in html.replace("&#x27;", "'") and "Plotly.newPlot" in html and "plotly.js v" in html
    assert "Does it copy? first draft accepted" in html
    assert ("tokens holds" in html and "it can never draft the rest" in html) == (vocab is not None)
    assert not re.search(r"<script[^>]+src=", html)  # self-contained: plotly.js is inlined, nothing is fetched
    why = d["misses"]  # why it misses, over the greedy runs
    assert why["steps"] > 0 and sum(why["accepted_length"]) == why["steps"] and why["contexts"]
    assert why["gap_unknown"] == 0 and why["near_ties"] + why["disagreements"] == why["refusals"]
    judged, cond = len(d["payoff"]["alpha_by_position"]), why["position"]["conditional"]  # None where none judged
    assert cond[:judged] == pytest.approx(d["payoff"]["alpha_by_position"]) and set(cond[judged:]) <= {None}
    assert "4 · Why does it miss?" in html and "Acceptance by draft position" in html


def test_check_cli_bad_input_is_one_line(capsys):
    assert main(["check", "--samples", "5"]) == 2
    err = capsys.readouterr().err
    assert "samples=5 is out of range" in err and err.count("\n") == 1
    assert main(["check", "--method", "pld", "--draft", "int8"]) == 2
    assert "does not apply to pld" in capsys.readouterr().err



def test_check_limit_takes_the_built_in_prompts(monkeypatch, capsys):
    """--limit without --prompts ran all six built-in prompts, and --limit 0 ran them all too: now it picks from the
    built-in set as from a file (round-robin across categories), and a value below 1 is one line. No model loads."""
    from specviz.cli import main as cli

    class Reached(Exception):
        pass

    seen = {}

    def run_check(target, drafter, prompts=None, **kwargs):
        seen["prompts"] = prompts
        raise Reached

    monkeypatch.setattr(cli, "load_target", lambda args: None)
    monkeypatch.setattr(check, "drafter_for", lambda *args: (None, None))
    monkeypatch.setattr(check, "run_check", run_check)
    assert main(["check", "--method", "pld", "--limit", "0"]) == 2
    err = capsys.readouterr().err
    assert "limit=0 is out of range: use a positive integer" in err and err.count("\n") == 1, err
    with pytest.raises(Reached):
        main(["check", "--method", "pld", "--limit", "2"])
    assert [r["id"] for r in seen["prompts"]] == [r["id"] for r in check.DEFAULT_PROMPTS[:2]]


def test_a_near_certain_first_token_passes():
    """One bin whose probability sums a hair above 1 in float (a near-deterministic first token): the TV bound
    must stay a number, not NaN, so an exact sampler passes."""
    p = torch.tensor([1.0000099, 0.0], dtype=torch.float64)
    f = stats.fit(torch.tensor([20.0, 0.0]), p)
    assert f.bins == 1 and f.tv_bound == f.tv_bound and f.passed()


@pytest.mark.parametrize("method,branches", [("medusa", {}), ("eagle", {"lookup": 6, "retrieve": 6})])
def test_tree_methods_sample_exactly_on_the_real_pair(target, method, branches):
    """The check's fidelity test on the race's own tree engines at temperature 0.7, top-p 0.95: Medusa's tree and the
    default race (EAGLE's tree with prompt lookup's and the datastore's branches), every candidate of the tree
    verified against the residual (core/sampling.verify_tree). EAGLE's tree alone: the CLI check above at
    temperature 1. The synthetic suite with its planted bugs is tests/test_tree_sampling.py."""
    from specviz import engines
    from specviz.check.measure import sampling_fidelity
    from specviz.config import DecodeConfig

    engine = engines.build(method, target)
    assert type(engine).__name__ == "TreeEngine"
    options = CheckOptions(samples=100, temperature=0.7, max_new_tokens=8, synthetic_samples=0)
    candidates = [(r["id"], target.encode_prompt(r["prompt"])) for r in check.DEFAULT_PROMPTS[:3]]
    fid = sampling_fidelity(engine, target, candidates, options, lambda done: None,
                            DecodeConfig(method=method, top_p=0.95, **branches))
    assert fid.passed and fid.samples == 100 and fid.given is not None and fid.engine == "tree", fid.fit
    assert fid.with_drafts == fid.samples


def test_the_gamma_a_check_names_is_the_one_set_with_the_mean_drafted_beside_it():
    """A user set γ 4 for prompt lookup and read 'at γ=3' (the mean drafted, rounded): the verdict, the tab's card and
    the report name the γ set, and the mean where it differs."""
    from specviz.check.options import gamma_words

    assert gamma_words(4, 3.0) == "γ=4 (3.0 drafted a step on average)"
    assert gamma_words(4, 4.0) == gamma_words(4, None) == "γ=4"
    assert gamma_words("auto", 2.6) == "γ auto (2.6 drafted a step on average)"
