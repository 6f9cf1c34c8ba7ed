"""Engines: greedy identity with AR, verdict bookkeeping, KV-cache consistency, EOS and length caps."""
import pytest
import torch

from specviz import engines
from specviz.config import DecodeConfig
from specviz.core.cache import CachedLM
from specviz.core.lookup import lookup, match
from specviz.engines.draft_model import ModelDrafter
from specviz.engines.speculative import Proposal, SpeculativeEngine, next_gamma
from specviz.events import Verdict
from specviz.metrics import summarize

PROMPT = [5, 9, 17, 3, 22, 9, 17, 3]


class ScriptedDrafter:
    """Proposes the reference continuation, except a wrong token at chosen absolute positions."""
    name = "scripted"

    def __init__(self, reference: list[int], wrong_at: set[int], vocab: int):
        self.reference, self.wrong_at, self.vocab = reference, wrong_at, vocab

    def session(self, vocab_size, eos_ids):
        return self

    def propose(self, tokens, gamma, cfg, generator):
        start = len(tokens)
        out = []
        for pos in range(start, min(start + gamma, len(self.reference))):
            t = self.reference[pos]
            out.append((t + 1) % self.vocab if pos in self.wrong_at else t)
        q = torch.zeros(len(out), self.vocab)
        if out:
            q[torch.arange(len(out)), torch.tensor(out)] = 1.0
        return Proposal(out, q, 0)

    def rollback(self, n_valid):
        pass


def run_ids(engine, prompt, cfg):
    return engines.generate(engine, prompt, cfg)


@pytest.mark.parametrize("gamma", [1, 3, 5, "auto"])
def test_greedy_identity_tiny(tiny_target, tiny_draft, gamma):
    cfg = DecodeConfig(max_new_tokens=40, gamma=gamma)
    ar = run_ids(engines.build("ar", tiny_target), PROMPT, cfg).token_ids
    for engine in [engines.build("vanilla", tiny_target, tiny_draft),
                   engines.build("vanilla", tiny_target, tiny_target),  # a perfect drafter
                   engines.build("pld", tiny_target)]:
        run = run_ids(engine, PROMPT, cfg)
        assert run.token_ids == ar, engine.method


def test_perfect_drafter_accepts_everything(tiny_target):
    cfg = DecodeConfig(max_new_tokens=30, gamma=4)
    run = run_ids(engines.build("vanilla", tiny_target, tiny_target), PROMPT, cfg)
    s = summarize("vanilla", run.events)
    assert s.alpha == 1.0
    assert all(e.emitted[-1].verdict in (Verdict.BONUS,) for e in run.events[:-1])
    assert s.tau > 4.0


def test_scripted_partial_acceptance(tiny_target):
    cfg = DecodeConfig(max_new_tokens=24, gamma=4)
    ar = run_ids(engines.build("ar", tiny_target), PROMPT, cfg)
    reference = PROMPT + ar.token_ids
    wrong = {len(PROMPT) + 2, len(PROMPT) + 9}
    drafter = ScriptedDrafter(reference, wrong, 64)
    run = run_ids(SpeculativeEngine("scripted", tiny_target, drafter), PROMPT, cfg)
    assert run.token_ids == ar.token_ids
    first = run.events[0]
    assert [d.verdict for d in first.drafts] == [Verdict.ACCEPTED, Verdict.ACCEPTED, Verdict.REJECTED,
                                                 Verdict.DISCARDED]
    assert [t.verdict for t in first.emitted] == [Verdict.ACCEPTED, Verdict.ACCEPTED, Verdict.RESAMPLED]
    rejected_at = []
    pos = len(PROMPT)
    for e in run.events:
        for d in e.drafts:
            if d.verdict is Verdict.REJECTED:
                rejected_at.append(pos + d.depth)
        pos += len(e.emitted)
    assert set(rejected_at) == wrong


def test_sampling_events_are_consistent(tiny_target, tiny_draft):
    cfg = DecodeConfig(max_new_tokens=60, gamma=3, temperature=1.0, seed=3)
    run = run_ids(engines.build("vanilla", tiny_target, tiny_draft), PROMPT, cfg)
    assert len(run.token_ids) == 60 or run.events[-1].finish_reason == "eos"
    assert sum(d.verdict is Verdict.REJECTED for e in run.events for d in e.drafts) >= 3  # refusals were judged
    for e in run.events:
        rejected = [d for d in e.drafts if d.verdict is Verdict.REJECTED]
        if rejected:
            assert e.emitted[-1].verdict is Verdict.RESAMPLED
            assert e.emitted[-1].token_id != rejected[0].token_id
        for d in e.drafts:
            if d.verdict in (Verdict.ACCEPTED, Verdict.REJECTED):
                assert 0.0 <= d.accept_prob <= 1.0
    again = run_ids(engines.build("vanilla", tiny_target, tiny_draft), PROMPT, cfg)
    assert again.token_ids == run.token_ids  # the run's own generator makes it reproducible


def test_kv_cache_after_rollback_matches_fresh(tiny_target):
    lm = CachedLM(tiny_target.model, tiny_target.device)
    tokens = PROMPT + [1, 2, 3]
    lm.logits(tokens, [40, 41, 42], keep=4)
    lm.rollback(len(tokens) + 1)  # keep one draft
    kept = tokens + [40]
    after = lm.logits(kept + [7])[0]
    fresh = CachedLM(tiny_target.model, tiny_target.device).logits(kept + [7])[0]
    assert torch.allclose(after, fresh, atol=1e-5)
    assert lm.cache.get_seq_length() == len(kept) + 1 == lm.seen


@pytest.mark.parametrize("keep", [1, 3, 4, 6])
def test_prompt_is_prefilled_on_its_own_before_drafts(tiny_target, keep):
    """A first verification (prompt + drafts) runs the prompt's forward alone, as plain decoding does, then the
    drafts: the same rows, keys and values as the two forwards made by hand (AMX CPUs change bf16 kernels past
    32 rows, so one big forward would give other bits)."""
    tokens, drafts = PROMPT + [1, 2, 3], [40, 41, 42]
    lm = CachedLM(tiny_target.model, tiny_target.device)
    lm.trace = []
    rows, hidden = lm.logits(tokens, drafts, keep=keep, features=True)
    assert [(t.start, len(t.fed)) for t in lm.trace] == [(0, len(tokens)), (len(tokens), len(drafts))]
    by_hand = CachedLM(tiny_target.model, tiny_target.device)
    first, h1 = by_hand.logits(tokens, keep=len(tokens), features=True)
    rest, h2 = by_hand.logits(tokens, drafts, keep=len(drafts), features=True)
    assert rows.shape[0] == keep and torch.allclose(rows, torch.cat([first, rest])[-keep:], atol=1e-5)
    assert torch.equal(hidden, torch.cat([h1, h2])) and lm.seen == len(tokens) + len(drafts)  # the same forwards
    assert torch.equal(lm.logits(tokens + drafts, [5], keep=2), by_hand.logits(tokens + drafts, [5], keep=2))


def test_eos_is_exact(tiny_target, tiny_draft):
    cfg = DecodeConfig(max_new_tokens=40, gamma=3)
    ar = run_ids(engines.build("ar", tiny_target), PROMPT, cfg).token_ids
    eos = ar[6]
    first = ar.index(eos)
    from tiny import tiny_model
    model = tiny_model(0, eos=eos)
    draft = tiny_model(1, eos=eos)
    built = [engines.build("ar", model), engines.build("vanilla", model, draft), engines.build("vanilla", model, model)]
    for engine in built:
        run = run_ids(engine, PROMPT, cfg)
        assert run.token_ids == ar[:first + 1], engine.method
        assert run.events[-1].finish_reason == "eos"


@pytest.mark.parametrize("n", [1, 2, 7])
def test_max_new_tokens_is_exact(tiny_target, n):
    for method in ["ar", "vanilla", "pld"]:
        engine = engines.build(method, tiny_target, tiny_target)
        run = run_ids(engine, PROMPT, DecodeConfig(max_new_tokens=n, gamma=5))
        assert len(run.token_ids) == n and run.events[-1].finish_reason == "length"


def test_auto_gamma_stays_in_bounds(tiny_target, tiny_draft):
    cfg = DecodeConfig(max_new_tokens=60, gamma="auto", gamma_auto_min=2, gamma_auto_max=6)
    for draft in (tiny_draft, tiny_target):
        run = run_ids(engines.build("vanilla", tiny_target, draft), PROMPT, cfg)
        assert all(2 <= e.gamma <= 6 or e.gamma == 60 - sum(len(x.emitted) for x in run.events[:i]) - 1
                   for i, e in enumerate(run.events))
    assert next_gamma(6, 6, 6, cfg) == 6 and next_gamma(2, 2, 0, cfg) == 2
    assert next_gamma(3, 3, 3, cfg) == 4 and next_gamma(4, 4, 1, cfg) == 3


def test_prompt_lookup():
    assert lookup([1, 2, 3, 4, 1, 2], 2, 3, 1) == [3, 4]
    assert lookup([1, 2, 3, 4, 9, 2], 3, 3, 1) == [3, 4, 9]
    assert lookup([1, 2, 3], 2, 3, 1) == []
    assert lookup([1, 2, 3, 4, 9, 2], 3, 3, 1, stop=frozenset({4})) == [3, 4]  # never past an EOS


def _scan_match(tokens, gamma, n_max, n_min, stop):
    """prompt lookup's rule as written: each n from n_max down, the context scanned from its end"""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tokens[-n:]:
                follow = tokens[start + n:start + n + gamma]
                ends = [i for i, t in enumerate(follow) if t in stop]
                if follow:
                    return follow[:ends[0] + 1] if ends else follow, n
    return [], 0


def test_lookup_match_is_the_scan_rule():
    """match finds the n-grams from the last token's places (a C scan), not n scans of the context: the same
    tokens and n as the plain rule on 20,000 random contexts of small vocabularies (many repeats, ties, stops)."""
    rng = torch.Generator().manual_seed(0)
    for _ in range(20000):
        size, vocab, gamma, n_max = (int(torch.randint(lo, hi, (1,), generator=rng)) for lo, hi in
                                     ((0, 30), (1, 6), (0, 6), (1, 6)))
        n_min = int(torch.randint(1, n_max + 1, (1,), generator=rng))
        tokens = torch.randint(0, vocab, (size,), generator=rng).tolist()
        stop = frozenset(torch.randint(0, vocab, (int(torch.randint(0, 2, (1,), generator=rng)),),
                                       generator=rng).tolist())
        assert match(tokens, gamma, n_max, n_min, stop) == _scan_match(tokens, gamma, n_max, n_min, stop), tokens


def test_repeat_split_asks_whether_the_first_draft_copies():
    """Each step's first own draft is filed under "repeats" when prompt lookup's 3..6-token rule predicts the
    target's token there, else "new"; grafted nodes and the drafter's rank-1 guesses never count."""
    from specviz.core.lookup import RepeatSplit, first_draft_sentence
    from specviz.events import LOOKUP_HEAD, DraftToken, EmittedToken, StepEvent

    def step(i, drafts, emitted):
        nodes = tuple(DraftToken(t, "", v, 0.5, depth=dep, rank=r, head=h) for t, v, dep, r, h in drafts)
        return StepEvent(step=i, drafts=nodes,
                         emitted=tuple(EmittedToken(t, "", Verdict.ACCEPTED) for t in emitted))
    A, R = Verdict.ACCEPTED, Verdict.REJECTED
    prompt = [7, 1, 2, 3, 4, 9, 1, 2]
    events = [step(0, [], [3]),  # the prefill drafts nothing: not counted
              step(1, [(4, A, 0, 0, 0), (9, A, 1, 0, 1)], [4, 9, 5]),  # after 1 2 3 the context says 4: repeats, right
              # after 9 5: new, own top wrong
              step(2, [(8, R, 0, 0, 0), (6, A, 0, 1, 0), (6, A, 0, 0, LOOKUP_HEAD)], [6]),
              step(3, [(1, R, 0, 0, 0)], [2]),  # after 5 6: new (no match), wrong
              step(4, [(3, A, 0, 0, 0)], [3])]  # after 5 6 2: no 3-token match (only "2" recurs): new, right
    split = RepeatSplit.of(prompt, events)
    assert (split.repeat_steps, split.repeat_accepted, split.new_steps, split.new_accepted) == (1, 1, 3, 1)
    assert split.repeat_share == 0.25 and split.repeat_rate == 1.0 and split.new_rate == 1 / 3
    total = split + split
    assert total.to_dict()["repeat_steps"] == 2 and total.new_rate == split.new_rate
    assert RepeatSplit().repeat_rate is None and RepeatSplit().repeat_share is None
    assert first_draft_sentence(split.to_dict()) == ("first draft accepted 100% of 1 steps where the answer repeats "
                                                      "its context (25% of steps), 33% of 3 elsewhere")
    never = {**split.to_dict(), "repeat_steps": 0, "repeat_accepted": 0, "repeat_rate": None, "repeat_share": 0.0}
    assert first_draft_sentence(never) == ("first draft accepted 33% of 3 steps; the answer never repeated its "
                                           "context")  # not "– of 0 steps where ..."


def test_model_drafter_reports_its_distribution(tiny_target, tiny_draft):
    session = ModelDrafter(tiny_draft).session(64, frozenset())
    cfg = DecodeConfig(temperature=1.0)
    prop = session.propose(PROMPT, 3, cfg, torch.Generator().manual_seed(0))
    assert prop.q_draft.shape == (3, 64) and prop.forwards == 3
    assert torch.allclose(prop.q_draft.sum(-1), torch.ones(3))


# --- the real default target (fp32), loaded once per session -------------------------------------

REAL_PROMPTS = ["Write two sentences about the sea.", "List three prime numbers and explain why they are prime."]


@pytest.mark.parametrize("prompt", REAL_PROMPTS)
def test_greedy_identity_real_target(target, prompt):
    ids = target.encode_prompt(prompt)
    cfg = DecodeConfig(max_new_tokens=32, gamma=4)
    ar = run_ids(engines.build("ar", target), ids, cfg)
    for method in ["vanilla", "pld"]:
        run = run_ids(engines.build(method, target, "int8"), ids, cfg)
        assert run.token_ids == ar.token_ids, method
    reference = ids + ar.token_ids
    scripted = SpeculativeEngine("scripted", target, ScriptedDrafter(reference, {len(ids) + 1, len(ids) + 8},
                                                                      target.vocab_size))
    run = run_ids(scripted, ids, cfg)
    assert run.token_ids == ar.token_ids
    # step 1 drafts positions 0..3 and is refused at 1; step 2 keeps 2..5 plus the bonus at 6;
    # step 3 drafts 7..10 and is refused at 8
    assert [[d.verdict for d in e.drafts].count(Verdict.REJECTED) for e in run.events[:3]] == [1, 0, 1]
