"""The checkpoint's dense tensors: ``model.state_dict()`` less the embedding modules' entries,
without building the embedding modules' own state dicts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from neo.config import TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.train.checkpoint.dcp_state import dense_state, dense_tensors, embedding_prefixes
from neo.train.checkpoint.digest import _dense_lines


class _Sparse(nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = TableBatchedEmbedding([TableConfig("a", 20, 4), TableConfig("b", 30, 8)], seed=1)
        self.proj = nn.Linear(12, 3)
        self.register_buffer("scale", torch.tensor([2.0]))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.BatchNorm1d(4))
        self.sparse_arch = _Sparse()
        self.top = nn.Linear(7, 1)
        self.register_parameter("gain", nn.Parameter(torch.ones(3)))
        self.empty = None


def _oracle(model: nn.Module) -> dict:
    skip = embedding_prefixes(model)
    return {k: v for k, v in model.state_dict().items() if not k.startswith(skip)}


def _model() -> _Model:
    torch.manual_seed(0)
    model = _Model()
    # a leaf module's state-dict hook still applies (its subtree holds no embedding module)
    model.top._register_state_dict_hook(lambda m, sd, prefix, meta: sd.update({f"{prefix}extra": torch.ones(1)}))
    return model


def test_dense_tensors_equal_the_filtered_state_dict_in_order_without_the_embedding_state_dict(monkeypatch):
    model = _model()
    want = _oracle(model)
    assert "top.extra" in want and "sparse_arch.scale" in want and "sparse_arch.scratch" not in want

    def refuse(*args, **kwargs):
        raise AssertionError("the embedding module's state_dict was built")

    monkeypatch.setattr(model.sparse_arch.ebc, "state_dict", refuse)
    got = dense_tensors(model)
    assert list(got) == list(want)
    for k in want:
        assert torch.equal(got[k], want[k]) and not got[k].requires_grad, k
    opt = torch.optim.Adam([p for n, p in model.named_parameters() if not n.startswith("sparse_arch.ebc.")])
    assert list(dense_state(model, opt)["model"]) == list(want)
    assert [line.split("=")[0] for line in _dense_lines(model, opt) if line.startswith("dense/")] == \
        [f"dense/{k}" for k in want]


@pytest.mark.parametrize("top_level", [True, False])
def test_a_model_that_is_the_embedding_module_or_has_none(top_level):
    if top_level:                                  # the embedding module itself: nothing dense
        model = TableBatchedEmbedding([TableConfig("a", 20, 4)], seed=1)
        assert dense_tensors(model) == {}
    else:                                          # no Neo embedding module: "embedding." dropped by name
        model = nn.Module()
        model.embedding = nn.EmbeddingBag(10, 4)
        model.top = nn.Linear(4, 1)
        assert list(dense_tensors(model)) == ["top.weight", "top.bias"] == list(_oracle(model))
