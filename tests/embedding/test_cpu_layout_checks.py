"""neo._C's embedding entry points refuse a layout that would take a kernel outside its tensors
(found by the bad-input audit of 2026-11-29: a negative batch size or a row offset past the
group's rows crashed the process, a negative weight offset read memory outside the weights).
The Python layer builds these tensors from a checked layout; the checks keep direct callers safe."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neo import _C


def L(*x: int) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int64)


ROWS, DIM = 10, 4
META = dict(table_rows=L(ROWS), table_dims=L(DIM), weight_offsets=L(0), row_offsets=L(0), feature_table=L(0),
            output_offsets=L(0, DIM), feature_mean=L(0))


def forward(weights: torch.Tensor, **changes):
    args = dict(weights=weights, indices=L(1, 2, 7), offsets=L(0, 1, 3), per_sample_weights=None, batch_size=2,
                **META)
    args.update(changes)
    return _C.embedding_forward(**args)


def backward(weights: torch.Tensor, states, **changes):
    meta = dict(META)
    meta.update({k: v for k, v in changes.items() if k in META})
    B = changes.get("batch_size", 2)
    return _C.embedding_backward_update(weights, states, torch.ones(max(B, 0), DIM), L(1, 9), L(0, 1, 2), None,
                                        *meta.values(), B, 2, 0.1, 1e-8, 0.0, 0.9, 0.999, 1, 0, False)


def test_a_good_layout_pools_as_embedding_bag():
    w = torch.randn(ROWS * DIM)
    out, skipped = forward(w)
    want = F.embedding_bag(L(1, 2, 7), w.view(ROWS, DIM), L(0, 1), mode="sum")
    assert skipped == 0 and torch.equal(out, want)


@pytest.mark.parametrize("changes,message", [
    (dict(batch_size=-1, offsets=torch.zeros(0, dtype=torch.int64)), "batch_size must be >= 0, got -1"),
    (dict(weight_offsets=L(-1_000_000)), r"table 0: .* must be >= 0, got 10, 4, -1000000, 0"),
    (dict(table_rows=L(-5)), r"table 0: .* must be >= 0, got -5, 4, 0, 0"),
    (dict(table_dims=L(-4), output_offsets=L(0, -4)), r"table 0: .* must be >= 0, got 10, -4, 0, 0"),
    (dict(row_offsets=L(3)), r"table 0: row_offsets 3 \+ 10 rows exceeds the group's 10 rows"),
    (dict(output_offsets=L(-4, 0)), "output_offsets must start at 0, got -4"),
    (dict(feature_mean=L(7)), "feature_mean must be 0 or 1, got 7 for feature 0"),
])
def test_a_bad_layout_is_refused_before_any_kernel_runs(changes, message):
    with pytest.raises(RuntimeError, match=message):
        forward(torch.zeros(ROWS * DIM), **changes)


@pytest.mark.parametrize("changes,message", [
    (dict(row_offsets=L(100_000)), "row_offsets 100000 \\+ 10 rows exceeds"),
    (dict(batch_size=-1), "batch_size must be >= 0"),
])
def test_the_fused_backward_refuses_them_too(changes, message):
    w, state = torch.zeros(ROWS * DIM), torch.zeros(ROWS)                  # rowwise adagrad: one value a row
    with pytest.raises(RuntimeError, match=message):
        backward(w, [state], **changes)
    assert torch.equal(w, torch.zeros(ROWS * DIM)) and torch.equal(state, torch.zeros(ROWS))
