"""The MLP's fused Linear + ReLU (neo.models.mlp._LinearReLUFn, csrc/kernels/bias_relu.h).

- per ISA variant this machine runs: ``bias_relu_`` equals ``torch.relu(y + b)`` to the bit and
  ``relu_bias_backward``'s masked gradient equals torch's ``threshold_backward`` to the bit
  (NaN, infinities, zeros of both signs included); the bias gradient matches an fp64 column sum
  and has the same bits at 1 and 2 threads;
- the MLP against plain ``F.linear`` + ``F.relu`` layers on copies of its parameters: output and
  every gradient (second-order ones too), the fused node in the graph, its fall-backs (autocast,
  ``split_backward``);
- bad shapes and dtypes are refused with the argument named.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neo._C as C  # a missing build must fail here, not skip
from neo.cpp import use_cpu_isa
from neo.models import MLP

VARIANTS = C.cpu_isa_supported()


def _special_rows(rows: int, n: int, seed: int):
    """(y, b) with ordinary values plus NaN, +-inf, and sums that are exactly +0 or -0."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randn(rows, n, generator=gen)
    b = torch.randn(n, generator=gen)
    if rows and n >= 6:
        y[0, 0] = float("nan")
        y[0, 1] = float("inf")
        y[0, 2] = float("-inf")
        y[0, 3] = -b[3]                         # y + b = +0
        y[0, 4], b[4] = -0.0, -0.0              # y + b = -0
        y[-1, 5] = -b[5] + 1e-7                 # tiny positive or zero after rounding
    return y, b


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("rows,n", [(300, 70), (64, 512), (129, 8), (1, 6), (0, 8)])
def test_bias_relu_kernels_match_torch(isa, rows, n):
    y, b = _special_rows(rows, n, seed=rows + n)
    g = torch.randn(rows, n, generator=torch.Generator().manual_seed(7))
    with use_cpu_isa(isa):
        out = y.clone()
        assert C.bias_relu_(out, b) is not None
        expected = torch.relu(y + b)
        assert torch.equal(out.isnan(), expected.isnan())
        assert torch.equal(out.nan_to_num(nan=0.0), expected.nan_to_num(nan=0.0))   # +0 == -0 here
        assert not torch.signbit(out[~out.isnan()]).any()                          # relu(-0) = +0

        gp, gb = C.relu_bias_backward(g, out)
        assert torch.equal(gp, torch.ops.aten.threshold_backward(g, out, 0))
        torch.testing.assert_close(gb.double(), gp.double().sum(0), rtol=1e-6, atol=1e-5)
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            gp1, gb1 = C.relu_bias_backward(g, out)
            torch.set_num_threads(2)
            gp2, gb2 = C.relu_bias_backward(g, out)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(gp1, gp2) and torch.equal(gb1, gb2) and torch.equal(gb1, gb)


def test_bias_relu_refuses_bad_arguments():
    y = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="bias must be a contiguous fp32 CPU tensor of \\(8,\\)"):
        C.bias_relu_(y, torch.randn(7))
    with pytest.raises(RuntimeError, match="y must be a contiguous 2-D fp32"):
        C.bias_relu_(torch.randn(8, 4).t(), torch.randn(8))
    with pytest.raises(RuntimeError, match="y must be a contiguous 2-D fp32"):
        C.bias_relu_(y.double(), torch.randn(8))
    with pytest.raises(RuntimeError, match="differ in shape"):
        C.relu_bias_backward(torch.randn(4, 7), y)


def _plain(x, params, final_activation: bool):
    h = x
    for i in range(0, len(params), 2):
        h = F.linear(h, params[i], params[i + 1])
        if i + 2 < len(params) or final_activation:
            h = F.relu(h)
    return h


@pytest.mark.parametrize("final_activation", [True, False])
def test_mlp_fused_layers_match_plain_linear_relu(final_activation):
    """DLRM's bottom tower shape (13 -> 512 -> 256 -> 64) against F.linear + F.relu on copies of
    the parameters: output and every gradient; the fused node runs where Linear meets ReLU."""
    torch.manual_seed(11)
    mlp = MLP(13, [512, 256, 64], final_activation=final_activation)
    ref_params = [p.detach().clone().requires_grad_() for p in mlp.parameters()]
    x = torch.randn(300, 13, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out, expected = mlp(x), _plain(x_ref, ref_params, final_activation)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    g = torch.randn(out.shape)
    got = torch.autograd.grad(out, [x] + list(mlp.parameters()), g)
    want = torch.autograd.grad(expected, [x_ref] + ref_params, g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    last = "LinearReLUFn" if final_activation else "_LinearFn"
    assert last in type(out.grad_fn).__name__
    assert "_LinearFnBackward" == type(mlp[0](x).grad_fn).__name__   # a Linear alone: _LinearFn
    # the same modules and state dict as the plain sequence
    assert [type(m).__name__ for m in mlp] == (["Linear", "ReLU"] * 3)[: 6 if final_activation else 5]
    assert list(mlp.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]


def test_mlp_fused_layers_are_differentiable_twice():
    """A gradient penalty (the input gradient taken with create_graph=True, its square
    differentiated): the second-order gradients of every parameter and of the input equal
    those of plain F.linear + F.relu layers. Before, the fused layers' masked gradient came from
    the kernel without a graph: the penalty's gradients for every layer but the first were
    missing (None where unused gradients are allowed, an error otherwise)."""
    torch.manual_seed(13)
    mlp = MLP(13, [32, 16, 4])
    ref_params = [p.detach().clone().requires_grad_() for p in mlp.parameters()]
    x = torch.randn(50, 13, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()

    def penalty_grads(out, x, params):
        gx, = torch.autograd.grad(out.sum(), x, create_graph=True)
        penalty = (gx ** 2).sum() + (out ** 2).sum()
        return torch.autograd.grad(penalty, [x] + params, allow_unused=True)

    got = penalty_grads(mlp(x), x, list(mlp.parameters()))
    want = penalty_grads(_plain(x_ref, ref_params, True), x_ref, ref_params)
    for a, e in zip(got, want):
        assert (a is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    assert "LinearReLUFn" in type(mlp(x).grad_fn).__name__


def test_mlp_runs_under_torch_func_transforms():
    """Per-sample gradients the torch.func way (vmap of grad of functional_call) equal each
    sample's gradients from autograd through the fused layers; before, the layers' autograd
    Functions refused every torch.func transform (they define no rules for them: the layers
    now take F.linear there)."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(14)
    mlp = MLP(13, [32, 8])
    params = {k: v.detach() for k, v in mlp.named_parameters()}
    x = torch.randn(6, 13)

    def loss(p, xi):
        return functional_call(mlp, p, (xi.unsqueeze(0),)).pow(2).sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, x)
    for i in range(x.shape[0]):
        out = mlp(x[i:i + 1])
        assert "LinearReLUFn" in type(out.grad_fn).__name__
        want = torch.autograd.grad(out.pow(2).sum(), list(mlp.parameters()))
        for (name, _), w in zip(mlp.named_parameters(), want):
            torch.testing.assert_close(per_sample[name][i], w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("final_activation", [True, False])
def test_mlp_forward_mode_ad_matches_plain_layers(final_activation):
    """Forward-mode AD (dual tensors, torch.func.jvp) through the MLP gives the tangent of
    F.linear + F.relu layers on copies of its parameters, as torch differentiates them; before,
    the fused layers' Functions raised (no jvp). Outside the dual level the fused node runs again."""
    import torch.autograd.forward_ad as fwAD
    from torch.func import jvp

    torch.manual_seed(15)
    mlp = MLP(13, [32, 16, 8], final_activation=final_activation)
    params = [p.detach().clone() for p in mlp.parameters()]
    x, t = torch.randn(10, 13), torch.randn(10, 13)
    want_out, want_t = jvp(lambda a: _plain(a, params, final_activation), (x,), (t,))
    with fwAD.dual_level():
        got = fwAD.unpack_dual(mlp(fwAD.make_dual(x, t)))
    torch.testing.assert_close(got.primal, want_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.tangent, want_t, rtol=1e-5, atol=1e-6)
    out, tangent = jvp(mlp, (x,), (t,))
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tangent, want_t, rtol=1e-5, atol=1e-6)
    assert type(mlp(x.requires_grad_()).grad_fn).__name__ in ("_LinearFnBackward", "_LinearReLUFnBackward")


def test_mlp_fused_layers_fall_back_where_the_fast_path_does_not_apply():
    """Under autocast and with split_backward the layers run as torch's linear and relu."""
    from neo.models.mlp import splitting_backward

    torch.manual_seed(12)
    mlp = MLP(13, [32, 8])
    x = torch.randn(20, 13, requires_grad=True)
    assert "LinearReLUFn" in type(mlp(x).grad_fn).__name__
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "LinearReLUFn" not in type(mlp(x).grad_fn).__name__
        assert "LinearFn" not in type(mlp[0](x).grad_fn).__name__      # autocast: plain F.linear
    with splitting_backward(mlp):
        out = mlp(x)
        assert "LinearReLUFn" not in type(out.grad_fn).__name__
    torch.testing.assert_close(out, mlp(x))
