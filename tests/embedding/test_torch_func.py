"""TableBatchedEmbedding under torch.func's transforms and forward-mode AD.

A DLRM's loss as a function of its dense features (``torch.func.grad``, ``jvp``, ``hessian``;
per-feature sensitivities, Hessian-vector products) runs the lookup as a constant of the
function: the same rows as outside, no gradient to the tables, no fused optimizer step. The
oracle is autograd through the plain path (``torch.autograd.grad`` and ``functional.jvp``
with respect to the dense features only, which never run the lookup's backward). Before, the
lookup's autograd Function refused every transform ("must override the setup_context
staticmethod"), and the cpu backend's kernels, once past it, wrote into functorch's wrappers.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, hessian, jacfwd, jvp, vmap

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import EmbeddingInputError, TableBatchedEmbedding
from neo.models import DLRM
from neo.sparse import KeyedJaggedBatch

F, D, B, ROWS = 3, 8, 6, 40


def model_and_batch(backend: str, weighted: bool = False):
    torch.manual_seed(3)
    tables = [TableConfig(f"t{i}", ROWS, D, optimizer=OptimizerConfig("rowwise_adagrad", lr=0.5)) for i in range(F)]
    model = DLRM(TableBatchedEmbedding(tables, backend=backend), F, D, 4, [16, D], [16, 1])
    lengths = torch.randint(0, 4, (F * B,))
    ids = torch.randint(0, ROWS, (int(lengths.sum()),))
    weights = torch.rand(ids.numel()) if weighted else None
    batch = KeyedJaggedBatch(tuple(f"t{i}" for i in range(F)), ids, lengths, B, weights=weights)
    return model, batch, torch.randn(B, 4)


def tables_of(model) -> list:
    return [model.embedding.table_weight(f"t{i}").clone() for i in range(F)]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("weighted", [False, True])
def test_grad_jvp_hessian_of_the_dense_features(backend, weighted):
    model, batch, dense = model_and_batch(backend, weighted)
    before = tables_of(model)

    def loss(d):
        return model(d, batch).sigmoid().sum()

    got_grad = grad(loss)(dense)             # the module's first lookup: under the transform
    d = dense.clone().requires_grad_()
    (want_grad,) = torch.autograd.grad(loss(d), d)          # the lookup's backward never runs
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)
    t = torch.randn_like(dense)
    want_out, want_t = torch.autograd.functional.jvp(loss, dense, t)
    out, tangent = jvp(loss, (dense,), (t,))
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tangent, want_t, rtol=1e-5, atol=1e-6)
    row = lambda d0: model(torch.cat([d0.unsqueeze(0), dense[1:]]), batch)[0]   # noqa: E731
    torch.testing.assert_close(hessian(row)(dense[0]), torch.autograd.functional.hessian(row, dense[0]),
                               rtol=1e-4, atol=1e-5)
    for a, b in zip(before, tables_of(model)):     # no update anywhere above
        assert torch.equal(a, b)
    # and training outside the transforms still updates the tables
    model(dense, batch).sum().backward()
    assert any(not torch.equal(a, b) for a, b in zip(before, tables_of(model)))


def test_transformed_lookup_inputs_are_refused_with_the_tables_named():
    model, batch, dense = model_and_batch("cpu", weighted=True)
    emb = model.embedding

    def pooled_sum(w):
        b = KeyedJaggedBatch(batch.keys, batch.values, batch.lengths, B, weights=w)
        return emb(b).sum()

    with pytest.raises(EmbeddingInputError, match=r"per-id weights of the lookup into t0, t1, t2 are differentiated"):
        grad(pooled_sum)(batch.weights)
    stacked = torch.stack([batch.values, batch.values.flip(0)])

    def by_ids(ids):
        return emb(KeyedJaggedBatch(batch.keys, ids, batch.lengths, B)).sum()

    with pytest.raises(EmbeddingInputError, match=r"ids of the lookup into t0, t1, t2 are batched"):
        vmap(by_ids)(stacked)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_unpooled_lookup_under_grad_is_a_constant(backend):
    """``emb.sequence`` under ``torch.func.grad``: its rows as outside, no update; the module's
    first lookup made under the transform leaves nothing behind that breaks training after it
    (before, the cpu backend's per-table state made there held functorch's wrapped tensors)."""
    model, batch, _ = model_and_batch(backend)
    emb = model.embedding
    before = tables_of(model)
    x = torch.randn(D)

    def f(x):
        seq = emb.sequence(batch)
        return sum((s.values * x).sum() for s in seq.values())

    got = grad(f)(x)
    rows = emb.sequence(batch)
    torch.testing.assert_close(got, sum(s.values.detach().sum(0) for s in rows.values()), rtol=1e-5, atol=1e-6)
    for a, b in zip(before, tables_of(model)):
        assert torch.equal(a, b)
    sum(s.values.sum() for s in emb.sequence(batch).values()).backward()       # trains as before
    assert any(not torch.equal(a, b) for a, b in zip(before, tables_of(model)))


def test_batch_made_inside_the_function_and_jacfwd():
    """A batch built inside the transformed function (its tensors then carry functorch's wrappers,
    constants of the function) is looked up as a plain one; jacfwd (vmap over jvp) through the
    lookup equals autograd's Jacobian."""
    model, batch, dense = model_and_batch("cpu")

    def loss(d):
        b = KeyedJaggedBatch(batch.keys, batch.values + 0, batch.lengths * 1, B)
        return model(d, b).sigmoid()                                                   # (B,)

    d = dense.clone().requires_grad_()
    (want,) = torch.autograd.grad(loss(d).sum(), d)
    torch.testing.assert_close(grad(lambda x: loss(x).sum())(dense), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(jacfwd(loss)(dense), torch.autograd.functional.jacobian(loss, dense),
                               rtol=1e-5, atol=1e-6)
