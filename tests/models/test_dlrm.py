"""Models against plain re-statements of their formulas."""


import pytest
import torch

import neo._C as C  # a missing build must fail here, not skip
from neo.config.embedding import OptimizerConfig, TableConfig
from neo.cpp import use_cpu_isa, use_interaction_tiles
from neo.embedding import TableBatchedEmbedding
from neo.models import DLRM, DotInteraction, LowRankCrossNet
from neo.sparse import KeyedJaggedBatch

ISA_VARIANTS = C.cpu_isa_supported()   # every ISA variant of the fused kernel this machine runs
TALL_ISAS = ("avx2", "avx512")         # the variants with tall forward tiles (3 and 5 rows)
# (ISA, forward tiles): the AVX-512 variant's forward in 8- and 16-float tiles and in interleaved
# row groups, the AVX2 variant's in tiles of 2 and of 3 rows, the AVX-512 one's also in tiles of
# 5 rows (csrc/cpu_isa.h)
ISA_TILES = ([(isa, "narrow") for isa in ISA_VARIANTS]
             + [(isa, t) for isa in ISA_VARIANTS if isa == "avx512" for t in ("wide", "grouped")]
             + [(isa, "tall") for isa in ISA_VARIANTS if isa in TALL_ISAS])


def expected_forward_tiles(isa: str, tiles: str, D: int) -> str:
    """What the forward runs at D under a forced tile setting (csrc/cpu_isa.h)."""
    if tiles == "tall":
        return "tall" if isa in TALL_ISAS else "narrow"
    if isa != "avx512" or tiles == "narrow":
        return "narrow"
    if tiles == "wide":
        return "wide" if D >= 96 else "narrow"
    return "grouped" if D >= 16 else "narrow"


def test_dot_interaction_is_every_pair_once():
    torch.manual_seed(0)
    dense, pooled = torch.randn(3, 4), torch.randn(3, 2 * 4)
    out = DotInteraction(num_features=2, dim=4)(dense, pooled)
    e1, e2 = pooled[:, :4], pooled[:, 4:]
    expected = torch.cat([dense, (dense * e1).sum(1, keepdim=True), (dense * e2).sum(1, keepdim=True),
                          (e1 * e2).sum(1, keepdim=True)], dim=1)
    torch.testing.assert_close(out, expected)


def _interaction_formula(d, p, F, D):
    """[dense, v_i . v_j for i < j], v = [dense, pooled_1 .. pooled_F] (B, F + 1, D), plainly."""
    v = torch.cat([d.unsqueeze(1), p.view(-1, F, D)], 1)
    return torch.cat([d] + [(v[:, i] * v[:, j]).sum(1, keepdim=True) for i in range(F + 1) for j in range(i + 1, F + 1)], 1)


def test_dot_interaction_gradient_matches_autograd_of_the_formula():
    """The hand-written backward against autograd through a plain restatement, in float64."""
    torch.manual_seed(0)
    F, D, B = 5, 4, 3
    dense = torch.randn(B, D, dtype=torch.float64, requires_grad=True)
    pooled = torch.randn(B, F * D, dtype=torch.float64, requires_grad=True)
    plain = _interaction_formula(dense, pooled, F, D)
    out = DotInteraction(F, D)(dense, pooled)
    torch.testing.assert_close(out, plain)
    g = torch.randn(out.shape, dtype=torch.float64)
    expected = torch.autograd.grad(plain, (dense, pooled), g)
    got = torch.autograd.grad(out, (dense, pooled), g)
    for e, a in zip(expected, got):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda d, p: DotInteraction(F, D)(d, p), (dense, pooled))


@pytest.mark.parametrize("isa,tiles", ISA_TILES)
@pytest.mark.parametrize("F,D", [(1, 16), (3, 8), (5, 5), (15, 16), (16, 64), (26, 64), (31, 32), (40, 48), (26, 20),
                                 (26, 128), (2, 4), (7, 36), (26, 72), (1, 96), (2, 100), (5, 112), (26, 96),
                                 (26, 136), (40, 256)])
def test_fused_dot_interaction_matches_the_formula_in_float64(F, D, isa, tiles):
    """The C++ kernel (fp32) against the plain formula evaluated in float64, forward and
    backward, with the kernels of each ISA variant (their register blocks differ), and the
    AVX-512 forward in each of its tilings (wide from D 96 on, grouped from D 16 on).

    Shapes cover pair tiles and row blocks with remainders (n = F + 1 from 2 to 41: the
    grouped forward's blocks of 8 rows, then 4 or fewer), D a multiple of the vector width
    (4, 8, 16 floats) or not (the scalar tail columns), and remainders of the backward's
    column blocks."""
    assert DotInteraction(F, D)._fused, "neo._C is not built"
    with use_cpu_isa(isa), use_interaction_tiles(tiles):
        assert C.interaction_forward_tiles(D) == expected_forward_tiles(isa, tiles, D)
        assert C.interaction_wide(D) == (expected_forward_tiles(isa, tiles, D) == "wide")
        _fused_against_float64(F, D)


@pytest.mark.parametrize("isa,tiles", ISA_TILES)
def test_fused_dot_interaction_large_batch_streams_its_gradient(isa, tiles):
    """B 700 x 26 features x D 64 and B 300 x 26 x D 128: the pooled gradient (4.6 and 4 MB) is
    large enough for the backward's streaming stores (kStreamBytes in
    csrc/kernels/interaction.h); the same check against float64."""
    with use_cpu_isa(isa), use_interaction_tiles(tiles):
        _fused_against_float64(26, 64, B=700)
        _fused_against_float64(26, 128, B=300)


def test_interaction_tiles_setting_is_checked_and_restored():
    """An unknown tile setting is refused with the valid ones; the context manager restores
    the setting; "auto" takes wide tiles (from D 96 on) and grouped ones (D 16 to 95) only in
    the AVX-512 kernels, and only on Intel (not AMD families 19h and 1Ah, Zen 3 to 5); tall
    tiles in the AVX2 kernels on AMD (Zen 3 to 5), and in the AVX-512 kernels on Zen 4 (AMD
    family 19h: its only CPUs with AVX-512)."""
    before = C.interaction_tiles()
    with pytest.raises(RuntimeError, match="valid: auto, narrow, wide, grouped, tall"):
        C._set_interaction_tiles("broad")
    assert C.interaction_tiles() == before
    with use_interaction_tiles("wide"):
        assert C.interaction_tiles() == "wide"
    assert C.interaction_tiles() == before
    features = dict(C.cpu_features())
    amd = features["amd_family_19h"] or features["amd_family_1ah"]   # Zen 3 / 4, Zen 5
    for isa in ISA_VARIANTS:
        with use_cpu_isa(isa), use_interaction_tiles("auto"):
            assert not C.interaction_wide(64)
            assert C.interaction_wide(128) == (isa == "avx512" and not amd)
            full_rate = isa == "avx512" and not amd
            assert [C.interaction_forward_tiles(D) for D in (8, 16, 64, 95, 96, 128)] == (
                ["narrow", "grouped", "grouped", "grouped", "wide", "wide"] if full_rate
                else ["tall"] * 6 if (isa == "avx2" and amd) or (isa == "avx512" and features["amd_family_19h"])
                else ["narrow"] * 6)


def _fused_against_float64(F, D, B=37):
    """Each fp32 result within the bound of a sum of n fp32 products in any order, n u sum |term|
    (u = 2^-24; forward: n = D products per pair; backward: n = F + 1 terms per element, the
    pass-through and the F pair gradients times a row), the terms' magnitudes from the same
    formula on |inputs| in float64. A bound, not a tolerance fitted to these seeds: at D 256 one
    element was 1.3e-5 off (7e-5 relative) under --seed-shift 19, beyond the 1e-5 that stood here."""
    torch.manual_seed(F * 100 + D)
    dense, pooled = torch.randn(B, D), torch.randn(B, F * D)
    u = 2.0 ** -24
    d64, p64 = dense.double().requires_grad_(), pooled.double().requires_grad_()
    plain = _interaction_formula(d64, p64, F, D)
    da, pa = dense.double().abs().requires_grad_(), pooled.double().abs().requires_grad_()
    magnitude = _interaction_formula(da, pa, F, D)                                  # sum |term| per output
    d32, p32 = dense.clone().requires_grad_(), pooled.clone().requires_grad_()
    out = DotInteraction(F, D)(d32, p32)
    assert out.grad_fn is not None and "FusedDotInteraction" in out.grad_fn.name()
    err = (out.double() - plain).abs()
    assert (err <= D * u * magnitude).all(), float((err - D * u * magnitude).max())
    g = torch.randn(out.shape)
    expected = torch.autograd.grad(plain, (d64, p64), g.double())
    bounds = torch.autograd.grad(magnitude, (da, pa), g.double().abs())            # sum |term| per gradient
    got = torch.autograd.grad(out, (d32, p32), g)
    for e, a, m in zip(expected, got, bounds):
        err = (a.double() - e).abs()
        assert (err <= (F + 1) * u * m).all(), float((err - (F + 1) * u * m).max())


def test_fused_dot_interaction_equals_the_torch_path_and_falls_back_under_autocast():
    torch.manual_seed(1)
    F, D, B = 26, 64, 64
    dense, pooled = torch.randn(B, D), torch.randn(B, F * D)
    fused, ref = DotInteraction(F, D), DotInteraction(F, D, kernel="torch")
    torch.testing.assert_close(fused(dense, pooled), ref(dense, pooled), rtol=1e-6, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused(dense.requires_grad_(), pooled)
    assert "Fused" not in out.grad_fn.name()                  # autocast: the torch path, in bf16
    torch.testing.assert_close(out.float(), ref(dense, pooled), rtol=0.05, atol=0.5)
    with pytest.raises(ValueError, match="kernel"):
        DotInteraction(F, D, kernel="cuda")


def test_module_and_torch_ops_run_the_same_fused_node():
    """The module calls the fused autograd node without the dispatcher (neo._C's
    dot_interaction_eager); torch.ops.neo.dot_interaction is the same node registered as an op:
    equal outputs and gradients bit for bit, on a tensor and on PooledPieces. The eager entry
    declines (None) what the fused kernel does not take: fp64, and fp32 under CPU autocast."""
    from neo import _C
    from neo.models import PooledPieces

    torch.manual_seed(4)
    F, D, B = 5, 16, 7
    dense = torch.randn(B, D, requires_grad=True)
    pooled = torch.randn(B, F * D, requires_grad=True)
    g = torch.randn(B, D + (F + 1) * F // 2)
    out = DotInteraction(F, D)(dense, pooled)
    op_out = torch.ops.neo.dot_interaction(dense, pooled, F)
    assert "Fused" in out.grad_fn.name() and "Fused" in op_out.grad_fn.name()
    assert torch.equal(out, op_out)
    for a, b in zip(torch.autograd.grad(out, (dense, pooled), g), torch.autograd.grad(op_out, (dense, pooled), g)):
        assert torch.equal(a, b)
    offsets, strides = torch.arange(F) * D, torch.full((F,), F * D)
    pieces = PooledPieces(pooled, offsets, strides, 0.5, tensor=lambda: pooled)
    out = DotInteraction(F, D)(dense, pieces)
    op_out = torch.ops.neo.dot_interaction(dense, pooled, F, offsets, strides, 0.5)
    assert torch.equal(out, op_out)
    for a, b in zip(torch.autograd.grad(out, (dense, pooled), g), torch.autograd.grad(op_out, (dense, pooled), g)):
        assert torch.equal(a, b)
    assert _C.dot_interaction_eager(dense.double(), pooled.double(), F) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _C.dot_interaction_eager(dense, pooled, F) is None
    out64 = DotInteraction(F, D)(dense.double(), pooled.double())
    assert out64.dtype == torch.float64 and "Fused" not in out64.grad_fn.name()   # the torch path
    torch.testing.assert_close(out64.float(), op_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pieces", [False, True])
def test_fused_dot_interaction_backward_is_differentiable(pieces):
    """create_graph=True (a gradient penalty): the fused node's gradients carry a graph
    (csrc/interaction.cpp, backward_as_ops) and the second-order gradients, with respect to
    dense, pooled (a non-contiguous tensor, or PooledPieces whose gradient is times grad_scale)
    and the upstream gradient, agree with the torch path's. Before, the kernel's gradients
    carried none: autograd raised "does not require grad", or, beside another term, dropped
    the interaction's share without a word."""
    torch.manual_seed(5)
    F, D, B, scale = 4, 8, 3, 0.5
    n = F + 1
    dense = torch.randn(B, D, requires_grad=True)
    grad_out = torch.randn(B, D + n * F // 2, requires_grad=True)
    w_dense, w_pooled = torch.randn(B, D), torch.randn(B * F * D)
    if pieces:
        from neo.models import PooledPieces

        pooled = torch.randn(B * F * D, requires_grad=True)
        arg = PooledPieces(pooled, torch.arange(F) * D, torch.full((F,), F * D), scale,
                           tensor=lambda: pooled.view(B, F * D))
    else:
        pooled = torch.randn(F * D, B).t().detach().requires_grad_()   # (B, F * D), not contiguous
        arg = pooled

    def second_order(kernel, pooled_grad_scale):
        out = DotInteraction(F, D, kernel=kernel)(dense, arg)
        g_dense, g_pooled = torch.autograd.grad(out, (dense, pooled), grad_out, create_graph=True)
        penalty = ((g_dense * w_dense).sum() + (g_pooled.reshape(-1) * pooled_grad_scale * w_pooled).sum()
                   + (dense ** 2).sum())   # a term beside: with it, nothing raised before
        return (g_dense, g_pooled * pooled_grad_scale) + torch.autograd.grad(penalty, (dense, pooled, grad_out))

    fused = second_order("auto", 1.0)
    ref = second_order("torch", scale if pieces else 1.0)
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    out = DotInteraction(F, D)(dense, arg)
    assert "Fused" in out.grad_fn.name()
    plain = torch.autograd.grad(out, (dense, pooled), grad_out.detach())   # the kernel's backward
    for a, b in zip(plain, fused[:2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_dot_interaction_runs_under_torch_func_transforms(kernel):
    """torch.func's grad and vmap over the module (either kernel) give autograd's gradients
    through the fused node and the batched output; before, the fused node and _PairwiseDots
    refused every torch.func transform (the module now takes its torch path there, whose
    _PairwiseDots torch.func batches by generate_vmap_rule)."""
    from torch.func import grad, vmap

    torch.manual_seed(6)
    F, D, B = 4, 8, 5
    module = DotInteraction(F, D, kernel=kernel)
    dense, pooled = torch.randn(B, D), torch.randn(B, F * D)
    weight = torch.randn(B, D + (F + 1) * F // 2)
    got = grad(lambda d, p: (module(d, p) * weight).sum(), argnums=(0, 1))(dense, pooled)
    d, p = dense.clone().requires_grad_(), pooled.clone().requires_grad_()
    out = DotInteraction(F, D)(d, p)
    assert "Fused" in out.grad_fn.name()
    want = torch.autograd.grad((out * weight).sum(), (d, p))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    batched = vmap(lambda di, pi: module(di.unsqueeze(0), pi.unsqueeze(0)).squeeze(0))(dense, pooled)
    torch.testing.assert_close(batched, out.detach(), rtol=1e-5, atol=1e-5)


def _pair_tangents_f64(dense, pooled, t_dense, t_pooled, F: int, D: int) -> torch.Tensor:
    """d/de of the pairs v_i . v_j (i < j) at v + e t, in float64: t_i . v_j + v_i . t_j."""
    B = dense.shape[0]
    v = torch.cat([dense.unsqueeze(1), pooled.view(B, F, D)], 1).double()
    t = torch.cat([t_dense.unsqueeze(1), t_pooled.view(B, F, D)], 1).double()
    T = torch.einsum("bid,bjd->bij", t, v)
    i, j = torch.triu_indices(F + 1, F + 1, offset=1)
    return torch.cat([t_dense.double(), (T + T.transpose(1, 2))[:, i, j]], 1)         # (B, D + P)


@pytest.mark.parametrize("kernel", ["auto", "torch"])
def test_dot_interaction_forward_mode_ad(kernel):
    """Forward-mode AD through the module (either kernel): dual tensors, torch.func.jvp and
    jacfwd give the tangent of the pair formula in float64, and jacfwd equals jacrev; before,
    the fused node and _PairwiseDots raised (no jvp). Outside the dual level the fused node runs."""
    import torch.autograd.forward_ad as fwAD
    from torch.func import jacfwd, jacrev, jvp

    torch.manual_seed(7)
    F, D, B = 4, 8, 5
    module = DotInteraction(F, D, kernel=kernel)
    dense, pooled = torch.randn(B, D), torch.randn(B, F * D)
    t_dense, t_pooled = torch.randn(B, D), torch.randn(B, F * D)
    want = _pair_tangents_f64(dense, pooled, t_dense, t_pooled, F, D).float()
    with fwAD.dual_level():
        got = fwAD.unpack_dual(module(fwAD.make_dual(dense, t_dense), fwAD.make_dual(pooled, t_pooled)))
    torch.testing.assert_close(got.primal, module(dense, pooled), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.tangent, want, rtol=1e-5, atol=1e-5)
    _, tangent = jvp(module, (dense, pooled), (t_dense, t_pooled))
    torch.testing.assert_close(tangent, want, rtol=1e-5, atol=1e-5)
    fwd = jacfwd(module, argnums=(0, 1))(dense[:2], pooled[:2])
    rev = jacrev(module, argnums=(0, 1))(dense[:2], pooled[:2])
    for a, b in zip(fwd, rev):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if kernel == "auto":
        assert "Fused" in module(dense.requires_grad_(), pooled).grad_fn.name()


def test_dlrm_head_hessian_by_forward_over_reverse():
    """torch.func.hessian (forward mode over reverse) of a loss of DLRM's dense path (bottom MLP,
    fused interaction, top MLP) with respect to the dense features equals the reverse-over-reverse
    Hessian autograd takes through the fused nodes (create_graph)."""
    from torch.func import hessian

    torch.manual_seed(8)
    tables = [TableConfig(f"t{i}", 20, 8) for i in range(3)]
    model = DLRM(TableBatchedEmbedding(tables, backend="reference"), 3, 8, 4, [16, 8], [16, 1])
    dense, pooled = torch.randn(3, 4), torch.randn(3, 24)

    def loss(d):
        return model.head(d, pooled).sigmoid().sum()

    got = hessian(loss)(dense)                                                         # (3, 4, 3, 4)
    want = torch.autograd.functional.hessian(loss, dense)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    d = dense.clone().requires_grad_()
    assert "Fused" in model.interaction(model.bottom(d), pooled).grad_fn.name()


def test_unpickled_module_finds_the_fused_op_again(monkeypatch):
    """A module unpickled in a process that has not built one (the op not looked up yet there)
    still runs the fused kernel."""
    import pickle

    import neo.models.interaction as interaction

    blob = pickle.dumps(DotInteraction(3, 8))
    monkeypatch.setattr(interaction, "_eager_op", None)
    module = pickle.loads(blob)
    dense, pooled = torch.randn(4, 8, requires_grad=True), torch.randn(4, 24)
    out = module(dense, pooled)
    assert "Fused" in out.grad_fn.name()
    torch.testing.assert_close(out, DotInteraction(3, 8, kernel="torch")(dense, pooled), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("F", [0, 256])
def test_feature_counts_past_the_fused_kernel_take_the_torch_path(F):
    """The fused kernel serves 1 to 255 features: with none (the output is the dense part) or
    more, the module computes the same formula with torch (the audit of 2026-11-29 found F = 0
    raising in neo._C)."""
    D, B = 4, 3
    dense = torch.randn(B, D, requires_grad=True)
    pooled = torch.randn(B, F * D, requires_grad=True)
    out = DotInteraction(F, D)(dense, pooled)
    v = torch.cat([dense.unsqueeze(1), pooled.view(B, F, D)], 1).double()      # (B, F + 1, D)
    i, j = torch.triu_indices(F + 1, F + 1, offset=1)
    want = torch.cat([dense.double(), (v[:, i] * v[:, j]).sum(-1)], 1)          # (B, D + P)
    assert out.shape == (B, D + (F + 1) * F // 2)
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-5)
    out.sum().backward()
    assert dense.grad is not None and dense.grad.shape == (B, D)
    with pytest.raises(ValueError, match="num_features >= 0 and dim >= 1"):
        DotInteraction(-1, D)


@pytest.mark.parametrize("isa,tiles", ISA_TILES)
@pytest.mark.parametrize("D", [16, 128])
def test_fused_dot_interaction_reads_pooled_pieces_in_place(isa, tiles, D):
    """PooledPieces over a source-major buffer (two pieces of 3 and 2 features, as a 2-rank
    AlltoAll leaves them) against the torch path on the assembled (B, F * D) tensor; the
    gradient comes back in the buffer's layout, times grad_scale."""
    with use_cpu_isa(isa), use_interaction_tiles(tiles):
        _pooled_pieces_in_place(D)


def _pooled_pieces_in_place(D):
    from neo.models import PooledPieces

    torch.manual_seed(3)
    B, F, scale = 9, 5, 0.5
    widths = (3 * D, 2 * D)
    flat = torch.randn(B * sum(widths), requires_grad=True)
    p0 = flat[:B * widths[0]].view(B, widths[0])
    p1 = flat[B * widths[0]:].view(B, widths[1])
    assembled = torch.cat([p0, p1], 1)                                  # features 0..4 in order
    offsets = torch.tensor([0, D, 2 * D, B * widths[0], B * widths[0] + D])
    strides = torch.tensor([widths[0]] * 3 + [widths[1]] * 2)
    dense = torch.randn(B, D, requires_grad=True)
    pieces = PooledPieces(flat, offsets, strides, scale, tensor=lambda: assembled)
    out = DotInteraction(F, D)(dense, pieces)
    ref = DotInteraction(F, D, kernel="torch")(dense, assembled)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-5)
    g = torch.randn(out.shape)
    got = torch.autograd.grad(out, (dense, flat), g)
    expected_dense, expected_assembled = torch.autograd.grad(ref, (dense, assembled), g)
    expected_flat = torch.cat([expected_assembled[:, :widths[0]].reshape(-1),
                               expected_assembled[:, widths[0]:].reshape(-1)]) * scale
    torch.testing.assert_close(got[0], expected_dense, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], expected_flat, rtol=1e-5, atol=1e-5)
    bad = PooledPieces(flat, offsets + 1000, strides, scale, tensor=lambda: assembled)
    with pytest.raises(RuntimeError, match="reaches past the pooled buffer"):
        DotInteraction(F, D)(dense, bad)


def test_low_rank_cross_net_formula():
    torch.manual_seed(0)
    net = LowRankCrossNet(in_features=6, num_layers=2, low_rank=3)
    dense, pooled = torch.randn(5, 2), torch.randn(5, 4)
    x0 = torch.cat([dense, pooled], 1)
    x = x0
    for l in range(2):
        U, V, b = net.up[l].weight, net.down[l].weight, net.up[l].bias
        x = x0 * (x @ V.T @ U.T + b) + x
    torch.testing.assert_close(net(dense, pooled), x)


def test_dlrm_end_to_end_learns():
    torch.manual_seed(0)
    tables = [TableConfig(f"t{i}", 50, 8, optimizer=OptimizerConfig("adagrad", lr=0.1)) for i in range(3)]
    for interaction in ("dot", "dcn"):
        emb = TableBatchedEmbedding(tables, backend="reference")
        model = DLRM(emb, 3, 8, 4, [16, 8], [16, 1], interaction=interaction, dcn_rank=4)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        dense = torch.randn(64, 4)
        ids = torch.randint(0, 50, (3, 64))
        batch = KeyedJaggedBatch(("t0", "t1", "t2"), ids.flatten(), torch.ones(192, dtype=torch.int64), 64)
        labels = (ids[0] % 2).float()           # learnable from table t0 alone
        losses = []
        for _ in range(60):
            logits = model(dense, batch)
            assert logits.shape == (64,)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.5 * losses[0], (interaction, losses[0], losses[-1])


def test_split_backward_linear_computes_one_gradient_per_pass():
    """``split_backward`` (zero bubble's stages): the same function through torch's addmm node, whose
    backward asked for the input gradient alone leaves the weights without one, and after it the
    weight gradient alone; both equal _LinearFn's full backward."""
    from neo.models import MLP
    from neo.models.mlp import split_backward

    torch.manual_seed(5)
    mlp = MLP(13, [64, 32, 8])
    x = torch.randn(50, 13, requires_grad=True)
    g = torch.randn(50, 8)
    full = torch.autograd.grad(mlp(x), [x] + list(mlp.parameters()), g)
    split_backward(mlp)
    out = mlp(x)
    assert "LinearFn" not in type(mlp[0](x).grad_fn).__name__
    gx, = torch.autograd.grad(out, [x], g, retain_graph=True)
    assert all(p.grad is None for p in mlp.parameters())
    gw = torch.autograd.grad(out, list(mlp.parameters()), g)
    for a, e in zip((gx,) + gw, full):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    split_backward(mlp, on=False)
    assert "LinearFn" in type(mlp[0](x).grad_fn).__name__


@pytest.mark.parametrize("F,D", [(26, 64), (26, 128), (3, 8), (7, 36), (40, 48)])
@pytest.mark.parametrize("isa", [isa for isa in ISA_VARIANTS if isa in TALL_ISAS])
def test_tall_and_narrow_forward_tiles_agree_bit_for_bit(isa, F, D):
    """The tall tiles (AVX2: 3 rows, AVX-512: 5 rows) and the narrow ones (2 and 4 rows) sum
    each pair's products in the same lanes in the same order and reduce them by the same tree:
    identical outputs, not just close ones (the backward does not depend on the forward's tiles)."""
    torch.manual_seed(F + D)
    dense, pooled = torch.randn(19, D), torch.randn(19, F * D)
    with use_cpu_isa(isa):
        with use_interaction_tiles("narrow"):
            assert C.interaction_forward_tiles(D) == "narrow"
            narrow = DotInteraction(F, D)(dense, pooled)
        with use_interaction_tiles("tall"):
            assert C.interaction_forward_tiles(D) == "tall"
            tall = DotInteraction(F, D)(dense, pooled)
    assert torch.equal(tall, narrow)
