"""Bitwise-lossless verification on the real default target in bf16 on CPU (row-wise attention, padding where
the one-row kernels differ): a verified position's logits equal one-token decoding's bit for bit, for chains of
k = 1..16 and for the shipped Medusa and EAGLE trees. The same chain verified with stock sdpa attention must
differ, so these tests can fail."""
from __future__ import annotations

import pytest
import torch

from specviz import engines
from specviz.check.measure import verify_logit_diff
from specviz.config import DecodeConfig
from specviz.core import profile
from specviz.core.cache import CachedLM
from specviz.core.trees import Tree
from specviz.drafters import trained as drafters
from specviz.engines import SHIPPED
from specviz.models import drafts
from specviz.models import loader as models

PROMPT = "Explain why the sky is blue, in three sentences."


@pytest.fixture(scope="module")
def path(target_bf16) -> tuple[list[int], list[int]]:
    """The prompt's ids and 16 greedy tokens after it (a real continuation)."""
    ids = target_bf16.encode_prompt(PROMPT)
    run = engines.generate(engines.build("ar", target_bf16), ids, DecodeConfig(method="ar", max_new_tokens=16))
    return ids, run.token_ids


def one_token_rows(target: models.LoadedModel, ids: list[int], continuation: list[int]) -> torch.Tensor:
    """Plain decoding: the prompt's forward, then one token per forward. Row j predicts continuation[j]."""
    lm = CachedLM.of(target)
    rows = [lm.logits(ids)[0]]
    for j in range(len(continuation) - 1):
        rows.append(lm.logits(ids + continuation[:j + 1])[0])
    return torch.stack(rows)  # (n, V)


def chain_rows(target: models.LoadedModel, ids: list[int], continuation: list[int], k: int) -> torch.Tensor:
    """Verification as the chain loop runs it: the prompt's forward, then chunks of k + 1 tokens (the last
    committed token plus k drafts) in one forward each; only the accepted-path rows are kept."""
    lm = CachedLM.of(target)
    rows = [lm.logits(ids)[0]]
    done = 0
    while done < len(continuation) - 1:
        chunk = continuation[done:done + k + 1]
        logits = lm.logits(ids + continuation[:done], chunk, keep=len(chunk))
        rows.extend(logits[:len(continuation) - 1 - done])
        done += len(chunk)
    return torch.stack(rows[:len(continuation)])


def test_the_bf16_cpu_engine_is_bitwise(target_bf16):
    assert target_bf16.attention == "rowwise" and target_bf16.bitwise and target_bf16.guarantee == "bitwise"
    padded = target_bf16.fused is None and (models.native_bf16()
                                            or models.one_row_differs(target_bf16.model, torch.bfloat16))
    assert target_bf16.pad_one_row == padded  # the fused decoder is row-invariant by construction: no padding row


@pytest.fixture(scope="module")
def reference(target_bf16, path) -> torch.Tensor:
    return one_token_rows(target_bf16, *path)


@pytest.mark.parametrize("k", list(range(1, 17)))
def test_chain_verification_equals_one_token_decoding_bitwise(target_bf16, path, reference, k):
    ids, continuation = path
    assert float((chain_rows(target_bf16, ids, continuation, k) - reference).abs().max()) == 0.0


def test_sdpa_verification_is_not_bitwise(target_bf16, path):
    """The control: the same chains through stock sdpa (no row-wise attention, no padding) differ."""
    ids, continuation = path
    sdpa = models.get(target_bf16.name, target_bf16.device, torch.bfloat16, attention="sdpa")
    reference = one_token_rows(sdpa, ids, continuation)
    worst = max(float((chain_rows(sdpa, ids, continuation, k) - reference).abs().max()) for k in (3, 4, 15))
    assert worst > 0.0


# a 16-node, 4-deep tree of Medusa's shape (the shipped trees are sized for this CPU and may be small)
WIDE = [list(p) for p in drafters.choose_tree(torch.tensor([[0.6, 0.2, 0.1, 0.05]] * 4), 16)]
# more than 32 rows: AMX CPUs verify it in pieces (models.BF16_ROWS); elsewhere in one forward
BIG = [list(p) for p in drafters.choose_tree(torch.tensor([[0.6, 0.2, 0.1, 0.05]] * 4), 40)]


@pytest.mark.parametrize("kind", ["medusa", "eagle", "wide", "big"])
def test_shipped_tree_verification_equals_one_token_decoding_bitwise(target_bf16, path, kind):
    """Every node of the shipped trees (and of a wide one), verified in one forward with the tree mask, has the
    logits one-token decoding computes after the same path."""
    ids, continuation = path
    if kind in ("wide", "big"):
        choices = {"wide": WIDE, "big": BIG}[kind]
    else:
        choices = drafters.load(SHIPPED / f"smollm2-135m-{kind}", target_bf16).cfg.tree
    tree = Tree.from_choices(choices)
    context = ids + continuation[:5]
    # the top rank follows the real continuation, the others are other tokens
    node_tokens = [continuation[5 + tree.depths[i] - 1] if tree.ranks[i] == 0
                   else (977 * (i + 3)) % target_bf16.vocab_size for i in range(tree.size)]
    lm = CachedLM.of(target_bf16)
    lm.logits(context[:-1])
    rows = lm.tree_logits(context, tree, node_tokens)  # (1 + n, V)
    worst = 0.0
    for i in range(-1, tree.size):  # -1: the root's own row
        branch, node = [], i
        while node >= 0:
            branch.insert(0, node_tokens[node])
            node = tree.parents[node]
        reference = CachedLM.of(target_bf16)
        reference.logits(context[:-1])
        logits = reference.logits(context)[0]  # the root, as a one-token step
        for j in range(len(branch)):
            logits = reference.logits(context + branch[:j + 1])[0]
        worst = max(worst, float((rows[i + 1] - logits).abs().max()))
    assert tree.size >= {"wide": 16, "big": 40}.get(kind, 2) and worst == 0.0


@pytest.mark.parametrize("method", ["vanilla", "pld", "eagle", "medusa", "draft"])
def test_engines_verify_bitwise(target_bf16, method):
    """The check's figure on real runs: the largest |Δlogit| between each verification row on the committed
    path and one-token decoding is 0 (int8 copy, prompt lookup, the trained drafters as chains)."""
    engine = engines.build(method, target_bf16, chain=True)
    ids = target_bf16.encode_prompt("Write a short poem about the sea, then explain its rhyme scheme.")
    run = engine.start(ids, DecodeConfig(method=method, max_new_tokens=40))
    run.target.trace = []
    while run.finish_reason is None:
        engine.cycle(run)
    diff, judged = verify_logit_diff(target_bf16, ids, run.tokens[len(ids):], run.target.trace)
    assert judged >= 40 and diff == 0.0


def test_verify_profile_and_costs(tiny_target):
    prof = profile.verify_profile(tiny_target, sizes=(1, 2, 4), context=8, reps=2)
    assert prof.tokens == [1, 2, 4] and len(prof.raw_seconds) == 3 and prof.ratio(1) == 1.0
    assert prof.seconds == sorted(prof.seconds) and all(s > 0 for s in prof.raw_seconds)
    assert prof.dtype == "float32" and prof.attention == tiny_target.attention


def test_row_kernel_is_row_invariant_and_accurate():
    """specviz/models/kernels/rowwise_linear.c: each output row has the same bits whatever the other rows, and
    matches an fp32 matmul of the same bf16 values to bf16 rounding."""
    from specviz.models import kernels

    if not kernels.available():
        pytest.skip("no C compiler or no AVX2/FMA here: the stock torch kernels run")
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(1000, 75, generator=generator) * 0.1).bfloat16()  # K = 75: the scalar tail runs too
    x = torch.randn(17, 75, generator=generator).bfloat16()
    out = kernels.linear(x, weight)  # (17, 1000): passes of 8, 8 and 1 rows
    assert out.dtype == torch.bfloat16 and out.shape == (17, 1000)
    for m in (1, 2, 5, 8, 9, 16):
        assert torch.equal(kernels.linear(x[:m], weight), out[:m])
    assert all(torch.equal(kernels.linear(x[i:i + 1], weight)[0], out[i]) for i in range(17))
    exact = torch.nn.functional.linear(x.float(), weight.float())
    assert torch.allclose(out.float(), exact, rtol=1e-2, atol=1e-2)


def test_kernels_compile_where_the_cpu_has_avx2_and_a_compiler():
    """A kernel that fails to compile falls back to torch silently at run time; here it must not."""
    import shutil

    from specviz.models import kernels

    if not {"avx2", "fma"} <= kernels.cpu_flags() or shutil.which("cc") is None:
        pytest.skip("no AVX2/FMA or no C compiler here")
    assert kernels.available()


@pytest.mark.parametrize("length,rows,dim", [(300, 16, 64), (7, 7, 64), (45, 12, 128)])
def test_attention_kernel_is_row_invariant_and_accurate(length, rows, dim):
    """specviz/models/kernels/attend.c, the row-wise attention: a row's bits are the same alone or among others (a
    chain and a tree-like mask), and match the torch row-by-row computation to fp32 rounding; rows that see fewer
    keys than one block of 8, and blocks cut short, included."""
    from specviz.models import attention, kernels

    if not kernels.available():
        pytest.skip("no C compiler or no AVX2/FMA here: the stock torch kernels run")
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads = 9, 3
    q = torch.randn(1, heads, rows, dim, generator=generator).bfloat16()
    k = torch.randn(1, kv_heads, length, dim, generator=generator).bfloat16()
    v = torch.randn(1, kv_heads, length, dim, generator=generator).bfloat16()
    mask = torch.ones(1, 1, rows, length, dtype=torch.bool)
    mask[0, 0] = torch.arange(length)[None, :] <= (length - rows + torch.arange(rows))[:, None]
    mask[0, 0, 5:, length - rows + 2] = False  # a branch the later rows do not see, as in a tree
    assert kernels.can_attend(q, k)
    # 16 rows x 9 heads over 300 keys: threaded (ATTEND_PARALLEL)
    out, _ = attention.rowwise_attention(None, q, k, v, mask)
    for i in range(rows):
        alone, _ = attention.rowwise_attention(None, q[:, :, i:i + 1], k, v, mask[:, :, i:i + 1].clone())
        assert torch.equal(alone[0, 0], out[0, i]), i
    reference = []
    for i, seen in enumerate(attention.visible_keys(mask.clone(), rows, length)):
        keys = torch.arange(seen) if isinstance(seen, int) else seen
        kk = k[0].float().repeat_interleave(heads // kv_heads, 0)[:, keys]  # (h, n, d)
        vv = v[0].float().repeat_interleave(heads // kv_heads, 0)[:, keys]
        p = torch.softmax(q[0, :, i].float()[:, None] @ kk.transpose(1, 2) * dim ** -0.5, dim=-1)
        reference.append((p @ vv)[:, 0])
    assert torch.allclose(out[0].float(), torch.stack(reference).bfloat16().float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("query", ["fp32", "bf16"])
@pytest.mark.parametrize("length,rows,dim,heads,kv_heads", [(300, 16, 64, 9, 3), (7, 7, 64, 9, 3), (45, 12, 128, 9, 3),
                                                       (33, 5, 80, 8, 2), (19, 4, 48, 6, 1)])
def test_attention_kernel_builds_agree_bit_for_bit(length, rows, dim, heads, kv_heads, query):
    """The AVX-512 build of the row-wise attention (16-lane registers) gives the AVX2 build's bits, so a greedy
    answer never depends on which one the CPU runs: odd block counts (D 80, 48), short rows and a branch included.
    With bf16 queries (the fused decoder's) the AVX512-BF16 build scores with vdpbf16ps, with fp32 ones it widens
    as the others do: both give the AVX2 bits."""
    from specviz.models import kernels

    builds = {isa: lib for isa in kernels.ISAS if (lib := kernels.library(isa)) is not None}
    if "avx2" not in builds or len(builds) < 2:
        pytest.skip("this CPU (or compiler) has no AVX-512 build to compare with the AVX2 one")
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(rows, heads, dim, generator=generator)
    if query == "bf16":
        q = q.bfloat16().float()
    k = torch.randn(kv_heads, length, dim, generator=generator).bfloat16()
    v = torch.randn(kv_heads, length, dim, generator=generator).bfloat16()
    index, offsets = [], [0]
    for r in range(rows):  # row r sees the keys up to its own position, later rows minus one branch key
        index += [j for j in range(length - rows + r + 1) if not (r >= 3 and j == length - rows + 1)]
        offsets.append(len(index))
    index, offsets = torch.tensor(index, dtype=torch.int32), torch.tensor(offsets, dtype=torch.int64)
    out = {isa: kernels.attend(q, k, v, index, offsets, dim ** -0.5, isa=isa) for isa in builds}
    assert all(torch.equal(out["avx2"], other) for other in out.values())  # AVX-512, and AVX512-BF16 where there
    assert out["avx2"].abs().sum() > 0


def test_row_kernel_serves_the_bf16_target_where_bf16_is_emulated(target_bf16):
    from specviz.models import kernels

    expected = models.uses_row_kernel(target_bf16.device, torch.bfloat16)
    assert (target_bf16.matmul == "specviz row kernel") == expected
    if expected:
        assert not target_bf16.pad_one_row  # row-invariant by construction: no padding row needed
        copy = drafts.int8_copy(target_bf16).model  # the int8 copy quantizes plain Linear modules
        assert not any(isinstance(m, kernels.RowLinear) for m in copy.modules())


@pytest.mark.parametrize("kind", ["eagle", "medusa", "layerskip", "draft"])
def test_one_layer_drafters_dtype_on_a_cpu(target_bf16, kind):
    """On a CPU beside a bf16 target the one-layer drafters run in bf16 on specviz's row kernel (fp32 where it is not
    built: torch's bf16 few-row matmuls are slower than fp32's), the draft model in the target's bf16 as it is;
    either way the greedy output is plain decoding's."""
    from specviz.models import kernels

    d = drafters.load(SHIPPED / f"{target_bf16.name}-{kind}", target_bf16)
    expect = torch.bfloat16 if kind == "draft" or kernels.available() else torch.float32
    assert d.dtype == expect and {p.dtype for p in d.module.parameters()} == {expect}
    on_kernel = any(isinstance(m, kernels.RowLinear) for m in d.module.modules())
    assert on_kernel == (kind != "draft" and kernels.available()) or target_bf16.matmul == "specviz row kernel"
    ids = target_bf16.encode_prompt("List three facts about the moon.")
    ar = engines.generate(engines.build("ar", target_bf16), ids, DecodeConfig(method="ar", max_new_tokens=24))
    run = engines.generate(engines.build(kind, target_bf16), ids, DecodeConfig(method=kind, max_new_tokens=24))
    assert run.token_ids == ar.token_ids and sum(e.n_accepted for e in run.events) > 0
