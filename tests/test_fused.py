"""The fused decoder (specviz/models/fused.py, kernels/packed_linear.c and llama.c): its matmul is row-invariant in
every build, it computes the stock model's function to bf16 accuracy, its KV buffer grows and keeps paths without
changing a bit, and LayerSkip's split run verifies bit for bit through it too."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from specviz import engines
from specviz.config import DecodeConfig
from specviz.core.cache import CachedLM
from specviz.core.trees import Tree
from specviz.models import fused, kernels
from specviz.models import loader as models

PROMPT = "Write a short story about a lighthouse keeper and a storm."


def packed_builds() -> dict:
    return {isa: lib for isa in kernels.ISAS if (lib := kernels.library(isa)) is not None}


def linear_packed(lib, x: torch.Tensor, packed: torch.Tensor, n: int, mode: int = fused.STORE_F32) -> torch.Tensor:
    fused._typed(lib)
    out = torch.empty(x.shape[0], n, dtype=torch.float32 if mode == fused.STORE_F32 else torch.bfloat16)
    lib.linear_packed(x.data_ptr(), packed.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], n, mode, 2)
    return out


@pytest.mark.parametrize("n,k", [(576, 576), (40, 64), (1000, 1536)])  # 40, 1000: a last block of 8 rows of zeros
def test_packed_matmul_is_row_invariant_in_every_build(n, k):
    """Each row's output has the same bits whatever the other rows (1 to 19: passes of up to 5, 8 or 16 rows, one or
    two blocks a pass, the pairs in slices past one pass), is the fp32 product of the bf16 values to bf16 rounding,
    and the AVX2 and AVX-512 builds agree."""
    builds = packed_builds()
    if not builds:
        pytest.skip("no C compiler or no AVX2/FMA here")
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(n, k, generator=generator) * 0.05).bfloat16()
    x = torch.randn(19, k, generator=generator).bfloat16()
    packed = fused.pack(weight)
    reference = (x.float() @ weight.float().T).bfloat16().float()  # (19, n)
    outs = {}
    for isa, lib in builds.items():
        out = linear_packed(lib, x, packed, n)
        for a, b in [(0, 1), (5, 6), (0, 2), (3, 8), (0, 9), (2, 19), (7, 12)]:
            assert torch.equal(linear_packed(lib, x[a:b].contiguous(), packed, n), out[a:b]), (isa, a, b)
        assert torch.allclose(out, reference, atol=2e-2, rtol=1e-2), isa
        outs[isa] = out
    if "avx512" in outs:
        assert torch.equal(outs["avx2"], outs["avx512"])


def row_dependence(lib, n: int, k: int) -> tuple | None:
    """The first (rows, mode) for which a row of a call of 1 to 17 rows does not get the bits it gets alone in this
    build, or None."""
    generator = torch.Generator().manual_seed(5)
    packed = fused.pack((torch.randn(n, k, generator=generator) * 0.05).bfloat16())
    x = torch.randn(17, k, generator=generator).bfloat16()
    alone = torch.cat([linear_packed(lib, x[i:i + 1].contiguous(), packed, n) for i in range(17)])
    for mode in (fused.STORE_F32, fused.ADD_BF16):
        for rows in range(1, 18):
            start = (3 * rows) % (18 - rows)  # the rows at different offsets into x
            part = x[start:start + rows].contiguous()
            if mode == fused.STORE_F32:
                if not torch.equal(linear_packed(lib, part, packed, n), alone[start:start + rows]):
                    return rows, "store"
            else:  # the residual add too: each row its own residual
                residual = torch.arange(rows * n, dtype=torch.float32).reshape(rows, n).remainder(7).bfloat16()
                summed = residual.clone()
                lib.linear_packed(part.data_ptr(), packed.data_ptr(), summed.data_ptr(), rows, k, n, mode, 2)
                if not torch.equal(summed, (residual.float() + alone[start:start + rows]).bfloat16()):
                    return rows, "add"
    return None


@pytest.mark.parametrize("n,k", [(576, 1536), (37, 96), (1000, 576)])  # 37: a scalar tail of 5 columns
def test_no_row_depends_on_the_other_rows(n, k):
    """For every number of rows 1 to 17 (every pass split each build makes: AVX2's passes of 2 to 5 rows with one or
    two blocks, AVX-512's of up to 8 or 16), each row of a call has the bits it gets alone, in every build: a change
    that lets the rows of a pass (or their number) touch a row's result fails here."""
    builds = packed_builds()
    if not builds:
        pytest.skip("no C compiler or no AVX2/FMA here")
    for isa, lib in builds.items():
        assert row_dependence(lib, n, k) is None, isa


def test_a_planted_row_dependence_is_caught(tmp_path):
    """The check above catches a kernel whose rows touch each other: a copy of the sources where every row past the
    first adds the first row's accumulator before rounding, built and loaded beside the real one."""
    import shutil
    import subprocess

    isa = kernels.best_isa()
    if isa is None or kernels.library(isa) is None:
        pytest.skip("no C compiler or no AVX2/FMA here")
    for name in (*kernels.SOURCES, *kernels.HEADERS):
        shutil.copy(kernels.SOURCE_DIR / name, tmp_path / name)
    source = tmp_path / "packed_linear.c"
    clean = "__m256 v = round8_bf16(_mm256_loadu_ps(t + j));"
    planted = "__m256 v = round8_bf16(_mm256_add_ps(_mm256_loadu_ps(t + j), _mm256_set1_ps(r ? tile[0] : 0.0f)));"
    assert clean in source.read_text()
    source.write_text(source.read_text().replace(clean, planted))
    subprocess.run(kernels.compile_command(isa, tmp_path / "planted.so", tmp_path), check=True, capture_output=True)
    assert row_dependence(fused.load_build(tmp_path / "planted.so"), 576, 576) == (2, "store")


def test_packed_matmul_modes():
    """STORE_BF16 rounds like torch's bf16 Linear output; ADD_BF16 adds to what is there and rounds the sum."""
    if not kernels.available():
        pytest.skip("no C kernels here")
    generator = torch.Generator().manual_seed(2)
    weight, x = torch.randn(48, 32, generator=generator).bfloat16(), torch.randn(3, 32, generator=generator).bfloat16()
    lib, packed = fused._lib(), fused.pack(weight)
    as_f32 = linear_packed(lib, x, packed, 48)
    as_bf16 = linear_packed(lib, x, packed, 48, fused.STORE_BF16)
    assert torch.equal(as_bf16.float(), as_f32)
    residual = torch.randn(3, 48, generator=generator).bfloat16()
    summed = residual.clone()
    lib.linear_packed(x.data_ptr(), packed.data_ptr(), summed.data_ptr(), 3, 32, 48, fused.ADD_BF16, 1)
    assert torch.equal(summed, residual + as_bf16)


def test_packed_linear_is_the_linear_it_replaces():
    """fused.PackedLinear (the drafters' Linears): the packed matmul of the same weight for inputs of any leading
    shape, each row on its own, its bias added after the rounded product, and nn.Linear's result to bf16 rounding;
    swap_in(kind=PackedLinear) replaces bf16 Linears with it and to_linear gives the original weight back."""
    if not kernels.available():
        pytest.skip("no C kernels here")
    generator = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(96, 40, bias=True).to(torch.bfloat16)  # 40 outputs: a last block of 8 zero rows
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 96, generator=generator) * 0.1)
        linear.bias.copy_(torch.randn(40, generator=generator))
    packed = fused.PackedLinear(linear)
    x = torch.randn(2, 5, 96, generator=generator).bfloat16()
    out = packed(x)
    assert out.shape == (2, 5, 40) and out.dtype == torch.bfloat16
    product = fused.linear_packed(x.reshape(10, 96), fused.pack(linear.weight), 40).reshape(2, 5, 40)
    assert torch.equal(out, product + linear.bias)
    assert all(torch.equal(packed(x[:, i:i + 1])[:, 0], out[:, i]) for i in range(5))  # row-invariant
    assert torch.allclose(out.float(), linear(x).float(), atol=0.05, rtol=0.02)
    module = torch.nn.Sequential(linear, torch.nn.Sequential(torch.nn.Linear(40, 8, bias=False).to(torch.bfloat16)))
    assert kernels.swap_in(module, bias=True, kind=fused.PackedLinear) == 2
    assert isinstance(module[0], fused.PackedLinear) and isinstance(module[1][0], fused.PackedLinear)
    assert module[0].to_linear().weight is linear.weight


@pytest.fixture(scope="module")
def pair(target_bf16):
    """The default target on the fused decoder and on the stock one (the same model)."""
    if target_bf16.fused is None:
        pytest.skip("the fused decoder does not run here (no C kernels)")
    return target_bf16, models.stock_decoder(target_bf16)


def test_fused_decoder_computes_the_stock_function(pair):
    """Each hidden state fed to the drafters (the embeddings, layers' outputs, the final norm's) and the logits are
    as close to the fp32 model's as the stock bf16 decoder's are (measured: 0.1-3% relative, both), and greedy
    decoding gives the stock decoder's tokens."""
    target, stock = pair
    ids = target.encode_prompt(PROMPT)
    fp32 = models.get(target.name, target.device, torch.float32)
    layers = (0, 5, 15, 29, 30)
    fast_logits, fast_states = CachedLM.of(target).logits(ids, keep=len(ids), features=layers)
    stock_logits, stock_states = CachedLM.of(stock).logits(ids, keep=len(ids), features=layers)
    exact_logits, exact_states = CachedLM.of(fp32).logits(ids, keep=len(ids), features=layers)
    d = target.model.config.hidden_size
    for i in range(len(layers)):
        fast, bf16, exact = (s[:, i * d:(i + 1) * d].float() for s in (fast_states, stock_states, exact_states))
        error = lambda a: float((a - exact).norm() / exact.norm())  # noqa: E731
        assert error(fast) <= 1.25 * error(bf16) + 1e-3, layers[i]
    assert float((fast_logits - exact_logits).abs().mean()) <= 1.25 * float((stock_logits - exact_logits).abs().mean())
    cfg = DecodeConfig(method="ar", max_new_tokens=24)
    assert (engines.generate(engines.build("ar", target), ids, cfg).token_ids
            == engines.generate(engines.build("ar", stock), ids, cfg).token_ids)


@pytest.mark.parametrize("isa", sorted(kernels.ISAS))
def test_every_build_decodes_row_invariantly(pair, monkeypatch, isa):
    """In each build this CPU runs, the layers give k rows fed together (k = 1 to 9 and 16: every pass split, AVX2's
    2-5 rows a pass, AVX-512's up to 8 or 16) the bits each gets fed alone, one at a time after the rows before it."""
    target, _ = pair
    lib = kernels.library(isa)
    if lib is None:
        pytest.skip(f"no {isa} build here")
    monkeypatch.setattr(fused, "_lib", lambda: fused._typed(lib))
    decoder = target.fused
    ids = (target.encode_prompt(PROMPT) * 2)[:26]
    hidden = decoder.embed(torch.tensor(ids))  # (26, d): a prefix of 10, then up to 16 rows
    cache = decoder.new_cache()
    decoder.layers(cache, hidden[:10], 0)
    alone = torch.cat([decoder.layers(cache, hidden[i:i + 1], i)[0] for i in range(10, 26)])  # slots 10..25
    for k in (1, 2, 3, 4, 5, 6, 7, 8, 9, 16):
        together, _ = decoder.layers(cache, hidden[10:10 + k], 10)  # over slots 10.. again: the same keys
        assert torch.equal(together, alone[:k]), (isa, k)


def test_a_trees_rows_read_the_slots_its_mask_allows(pair):
    """A tree forward's rows reach the C layers as attention.Visible (the context's length per row, then each node's
    lineage, spelled out by llama.c's row_spans): the layers give them the bits they give under the stock mask that
    tree_inputs builds (its slots taken by visible_index), for fed rows before the tree and a branching tree."""
    from specviz.core.trees import tree_inputs, tree_visible

    target, _ = pair
    decoder = target.fused
    ids = (target.encode_prompt(PROMPT) * 2)[:40]
    tree = Tree.from_choices([[0], [1], [0, 0], [1, 0], [1, 1], [0, 0, 0]])
    hidden = decoder.embed(torch.tensor(ids[:3] + [11, 101, 12, 13, 102, 14]))  # 3 fed rows, then the 6 nodes
    outs = []
    for by_mask in (False, True):
        cache = decoder.new_cache()
        decoder.layers(cache, decoder.embed(torch.tensor(ids[3:31])), 0)  # 28 cached slots
        if by_mask:
            positions, mask = tree_inputs(31, 3, tree, "sdpa", torch.bfloat16)
        else:
            positions, mask = tree_visible(31, 3, tree)
        outs.append(decoder.layers(cache, hidden, 28, positions.reshape(-1), mask)[0])
    assert torch.equal(outs[0], outs[1])


def test_kv_buffer_growth_and_kept_paths_change_no_bit(pair):
    """Fed one token at a time through a buffer that starts at 16 slots (grown 3 times), the last logits equal one
    forward of the whole sequence; a tree's kept path leaves what one-token decoding of that path leaves."""
    target, _ = pair
    ids = (target.encode_prompt(PROMPT) * 4)[:70]
    small = CachedLM.of(target)
    small.cache = fused.KVBuffer(target.fused.n_layers, target.fused.kv_heads, target.fused.head_dim, capacity=16)
    rows = [small.logits(ids[:20])[0]] + [small.logits(ids[:end])[0] for end in range(21, 71)]
    whole = CachedLM.of(target).logits(ids, keep=51)
    assert small.cache.capacity == 128 and torch.equal(torch.stack(rows), whole)
    tree = Tree.from_choices([[0], [1], [0, 0], [1, 0], [1, 1]])  # nodes 0..4 in this order; node 4's parent is 1
    nodes = [11, 101, 12, 13, 102]
    lm = CachedLM.of(target)
    lm.logits(ids[:60])
    lm.tree_logits(ids[:61], tree, nodes)
    lm.keep_path(61, [1, 4])
    after = lm.logits(ids[:61] + [101, 102, 21])[0]
    fresh = CachedLM.of(target)
    for end in range(61, 65):
        expected = fresh.logits((ids[:61] + [101, 102, 21])[:end])[0]
    assert tree.parents[4] == 1 and torch.equal(after, expected)


def test_layerskip_verifies_bitwise_through_the_fused_decoder(pair):
    """LayerSkip drafts through the first layers one token at a time and verifies through the rest (SplitLM): on the
    fused decoder its verification rows are one-token decoding's bit for bit, a wrong draft rolled back included,
    and its greedy answer is AR's."""
    from specviz.engines.layerskip import SplitLM

    target, _ = pair
    ids = target.encode_prompt(PROMPT)
    cfg = DecodeConfig(method="ar", max_new_tokens=12)
    answer = engines.generate(engines.build("ar", target), ids, cfg).token_ids
    one_token = CachedLM.of(target)
    reference = [one_token.logits(ids)[0]] + [one_token.logits(ids + answer[:j])[0] for j in range(1, len(answer))]
    lm = SplitLM(target.model, target.device, 6, fused=target.fused)
    rows, done = [lm.logits(ids)[0]], 0  # rows[j] predicts answer[j]
    while done + 4 < len(answer):
        committed = ids + answer[:done + 1]
        drafts = answer[done + 1:done + 4] + [7]  # three right drafts, then a wrong one
        for j in range(len(drafts) + 1):  # drafting runs the first layers one token at a time
            lm.early(committed + drafts[:j])
        rows.extend(lm.logits(committed, drafts, keep=len(drafts) + 1)[:4])  # the row after the wrong one: dropped
        lm.rollback(len(committed) + 3)  # the wrong draft rejected
        done += 4
    assert len(rows) >= 9 and torch.equal(torch.stack(rows), torch.stack(reference[:len(rows)]))
    layerskip = engines.build("layerskip", target)
    assert engines.generate(layerskip, ids, dataclasses.replace(cfg, method="layerskip")).token_ids == answer


def test_switched_off_and_unsupported(monkeypatch, tiny_target):
    """SPECVIZ_FUSED=0 keeps the stock decoder; so does an fp32 model."""
    assert tiny_target.fused is None and not fused.supports(tiny_target.model, tiny_target.device, torch.float32)
    monkeypatch.setenv("SPECVIZ_FUSED", "0")
    assert not fused.supports(tiny_target.model, torch.device("cpu"), torch.bfloat16)
