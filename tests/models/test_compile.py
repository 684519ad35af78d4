"""DLRM under ``torch.compile`` and ``torch.export``.

While a tracer runs, the dot interaction is the custom op ``neo::dot_interaction_fused`` (one node,
a fake kernel, a registered backward: neo/models/traced_ops.py), the MLPs' hidden layers the op
``neo::linear_relu`` (eager mode's kernels), and the embedding lookup runs eagerly
(``torch._disable_dynamo`` while Dynamo traces).
Before, Dynamo cut the dense head into 11 graphs (a break at every pybind kernel), ``torch.export`` of the head
failed (the C++ kernel read a fake tensor's missing data), and Dynamo traced into the lookup,
recompiling three of its frames for every new id count. The oracles: ``torch.library.opcheck``
(the fake kernel against the real one, the registered backward against the op's), the torch path
of the interaction (``kernel="torch"``) and eager training of the same model. Inductor compiles
the head in tests/tools/test_bench_compile.py (its logits and gradients against eager mode).
"""

from __future__ import annotations

import copy

import pytest
import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.cpp import cpu_kernels
from neo.embedding import TableBatchedEmbedding
from neo.models import DLRM
from neo.models.interaction import DotInteraction
from neo.models.traced_ops import dot_interaction_fused, linear_relu
from neo.sparse import KeyedJaggedBatch

pytestmark = pytest.mark.skipif(cpu_kernels("dot_interaction_forward") is None, reason="neo._C not built")

F, D, B = 4, 8, 16


class Head(torch.nn.Module):
    """A DLRM's dense part, ``(dense, pooled) -> logits``, as a module to compile or export."""

    def __init__(self, model: DLRM):
        super().__init__()
        self.model = model

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.model.head(dense, pooled)


def head(kernel: str = "auto", interaction: str = "dot") -> Head:
    torch.manual_seed(0)
    model = DLRM(torch.nn.Identity(), F, D, 13, [16, D], [32, 16, 1], interaction=interaction, dcn_rank=8)
    if kernel == "torch" and interaction == "dot":
        model.interaction = DotInteraction(F, D, kernel="torch")
    return Head(model)


def inputs(batch: int = B, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 13, generator=gen), torch.randn(batch, F * D, generator=gen)


def test_opcheck_dot_interaction_fused():
    for num_features, dim, batch in ((F, D, B), (1, 5, 3), (26, 16, 7)):
        dense = torch.randn(batch, dim, requires_grad=True)
        pooled = torch.randn(batch, num_features * dim, requires_grad=True)
        torch.library.opcheck(dot_interaction_fused, (dense, pooled, num_features))


def test_opcheck_linear_relu_and_its_gradients_against_torch():
    gen = torch.Generator().manual_seed(2)
    for batch, n_in, n_out in ((B, 13, 16), (1, 3, 5), (7, 64, 33)):
        x = torch.randn(batch, n_in, generator=gen, requires_grad=True)
        w = torch.randn(n_out, n_in, generator=gen, requires_grad=True)
        b = torch.randn(n_out, generator=gen, requires_grad=True)
        torch.library.opcheck(linear_relu, (x, w, b))
        out = linear_relu(x, w, b)
        assert torch.equal(out, torch.relu(torch.mm(x, w.t()) + b))      # eager mode's arithmetic
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, (x, w, b), g)
        want = torch.autograd.grad(torch.relu(x @ w.t() + b), (x, w, b), g)
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_linear_relu_without_the_kernels_is_torch_arithmetic(monkeypatch):
    """Where neo._C lacks the bias+ReLU kernels, the ops compute with torch's and agree with the kernels."""
    import neo.models.traced_ops as traced_ops

    gen = torch.Generator().manual_seed(3)
    x, w, b = (torch.randn(*shape, generator=gen, requires_grad=True) for shape in ((7, 12), (9, 12), (9,)))
    g = torch.randn(7, 9, generator=gen)
    with_kernels = linear_relu(x, w, b)
    grads = torch.autograd.grad(with_kernels, (x, w, b), g)
    monkeypatch.setattr(traced_ops, "cpu_kernels", lambda op: None)
    without = linear_relu(x, w, b)
    assert torch.equal(without, with_kernels)
    for a, e in zip(torch.autograd.grad(without, (x, w, b), g), grads):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


def test_the_op_matches_the_torch_path_forward_and_backward():
    gen = torch.Generator().manual_seed(1)
    dense, pooled = torch.randn(B, D, generator=gen), torch.randn(B, F * D, generator=gen)
    dense.requires_grad_(), pooled.requires_grad_()
    out = dot_interaction_fused(dense, pooled, F)
    d2, p2 = dense.detach().clone().requires_grad_(), pooled.detach().clone().requires_grad_()
    want = DotInteraction(F, D, kernel="torch")(d2, p2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(out)
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(dense.grad, d2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pooled.grad, p2.grad, rtol=1e-5, atol=1e-5)
    wrong = r"pooled must be \(B, F \* D\) = \(16, 40\) for dense \(16, 8\) and F = 5, got \(16, 32\)"
    with pytest.raises(ValueError, match=wrong):
        dot_interaction_fused(dense.detach(), pooled.detach(), 5)


def test_compiled_head_is_one_graph_and_matches_the_torch_path():
    model, reference = head(), head("torch")
    explained = torch._dynamo.explain(model)(*inputs())
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    ops = [n.target for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch.ops.neo.dot_interaction_fused.default in ops
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    for seed in (1, 2):
        dense, pooled = inputs(seed=seed)
        p1, p2 = pooled.clone().requires_grad_(), pooled.clone().requires_grad_()
        out, want = compiled(dense, p1), reference(dense, p2)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
        out.square().sum().backward()
        want.square().sum().backward()
        # The fused interaction and the torch path sum in different orders: a gradient element that
        # cancels to a small value keeps the rounding of its large terms (4.8e-6 on one of 0.017,
        # 2.7e-4 relative, under --seed-shift 19), so the absolute slack scales with the tensor's
        # largest element instead of a fixed 1e-6.
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-4, atol=1e-5 * float(p2.grad.abs().max()))
        for a, b in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5 * float(b.grad.abs().max()))


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_exported_head_runs_at_any_batch_size(interaction):
    model = head(interaction=interaction)
    batch = torch.export.Dim("batch", min=2)
    program = torch.export.export(model, inputs(), dynamic_shapes=({0: batch}, {0: batch}))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert (torch.ops.neo.dot_interaction_fused.default in targets) == (interaction == "dot")
    for size in (B, 5, 64):
        dense, pooled = inputs(size, seed=size)
        want = head("torch", interaction)(dense, pooled)
        torch.testing.assert_close(program.module()(dense, pooled), want, rtol=1e-5, atol=1e-6)


def test_compiled_dlrm_trains_as_eager_without_recompiling():
    """The lookup (its fused backward + row-wise Adagrad) runs eagerly between the compiled dense
    parts; batches of different id counts reuse the one compiled graph."""
    torch.manual_seed(3)
    tables = [TableConfig(f"t{i}", 50, D, optimizer=OptimizerConfig("rowwise_adagrad", lr=0.1)) for i in range(F)]
    eager = DLRM(TableBatchedEmbedding(tables, backend="cpu"), F, D, 13, [16, D], [32, 1])
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, backend="aot_eager")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, twin)]
    before = eager.embedding.table_weight("t0").clone()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step in range(4):
            gen = torch.Generator().manual_seed(step)
            lengths = torch.randint(0, 4, (F * B,), generator=gen)
            ids = torch.randint(0, 50, (int(lengths.sum()),), generator=gen)
            batch = KeyedJaggedBatch(tuple(f"t{i}" for i in range(F)), ids, lengths, B)
            dense, labels = torch.randn(B, 13, generator=gen), torch.rand(B, generator=gen).round()
            for model, opt in zip((eager, compiled), optimizers):
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, batch), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
    for i in range(F):
        torch.testing.assert_close(twin.embedding.table_weight(f"t{i}"), eager.embedding.table_weight(f"t{i}"),
                                   rtol=1e-5, atol=1e-6)
    assert not torch.equal(eager.embedding.table_weight("t0"), before)          # the lookup's optimizer ran
    for a, b in zip(twin.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
