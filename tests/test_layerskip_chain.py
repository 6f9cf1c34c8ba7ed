"""LayerSkip as a chain drafter (engines/layerskip_chain.py), which lets `check` and the Check tab take it: on the real
pair, greedy decoding with it equals plain decoding token for token, and its drafts are often kept."""
from __future__ import annotations

from specviz.check import run as check
from specviz.config import DecodeConfig
from specviz.engines.ar import AREngine
from specviz.engines.speculative import SpeculativeEngine


def test_layerskip_checks_as_a_chain_drafter(target):
    drafter, draft = check.drafter_for("layerskip", target, None)
    assert draft is None and type(drafter).__name__ == "LayerSkipChainDrafter"
    ids = target.encode_prompt("List the days of the week, one per line.")
    cfg = DecodeConfig(method="layerskip", gamma=3, temperature=0.0, max_new_tokens=24)
    plain = [t.token_id for e in AREngine(target).steps(ids, cfg.with_(method="ar")) for t in e.emitted]
    events = list(SpeculativeEngine("layerskip", target, drafter).steps(ids, cfg))
    assert [t.token_id for e in events for t in e.emitted] == plain
    drafted = sum(len(e.drafts) for e in events)
    kept = sum(d.verdict.value == "accepted" for e in events for d in e.drafts)
    assert drafted > 0 and kept > 0 and len(events) < len(plain)  # fewer target forwards than tokens
