"""tools/bench_pipeline.py's null model (the runtime's cost per action, ``op_ms``, is read off it):
every Linear is hollow whichever path runs it, so the null model computes the same under every
schedule and its chunk profile costs what its runs compute.

Before, only ``Linear.forward`` was hollowed; the pipeline's layers run a Linear followed by a
ReLU through ``Linear.forward_relu`` (one fused autograd function on the real weights), so the
null model was hollow only under zero bubble (``split_backward`` sends ``forward_relu`` through
``forward``), while its chunk profile timed the forward without ``split_backward``: the real
product. Zero bubble's ``op_ms`` came out low (0 at W = 2, 0.31 against 1F1B's 0.75 at W = 4)
and its step 0.76-0.81 of measured on a 2-core Xeon."""

from __future__ import annotations

import argparse

import torch
from torch import nn

from neo.models.mlp import Linear, linear_activation, splitting_backward
from neo.pipeline.layers import layers_of, split_stages
from tests.tools import load_tool

bench = load_tool("bench_pipeline.py")
ARGS = argparse.Namespace(width=32, top_layers=3)


def _hollow_by_hand(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """_Hollow's definition, written out: column 0 of x times column 0 of the weight, plus the bias."""
    w, b = linear.weight.detach(), linear.bias.detach()
    return x[:, 0:1] * w[:, 0].reshape(1, -1) + b.reshape(1, -1)


def test_every_linear_of_the_null_model_is_hollow_on_every_path():
    torch.manual_seed(0)
    model = bench._model(ARGS, nn.Identity(), hollow=True)
    pairs = model.bottom.layer_pairs() + model.top.layer_pairs()
    assert sum(act is not None for _, act in pairs) >= 3            # fused Linear + ReLU steps are covered
    for linear, act in pairs:
        assert isinstance(linear, Linear)
        x = torch.randn(6, linear.in_features)
        want = _hollow_by_hand(linear, x)
        if act is not None:
            want = torch.relu(want)
        for split in (False, True):                # 1F1B & co. / zero bubble (split_backward)
            linear.split_backward = split
            got = linear_activation(linear, act, x)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        linear.split_backward = False


def test_null_chunks_compute_alike_with_and_without_split_backward():
    """The null chunk profile (timed without split_backward) and zero bubble's null run (with it)
    compute the same thing; the real model's chunks are not hollow."""
    torch.manual_seed(0)
    B = 5
    dense, pooled = torch.randn(B, bench.NUM_DENSE), torch.randn(B, bench.F * bench.D)
    for hollow in (True, False):
        model = bench._model(ARGS, nn.Identity(), hollow=hollow)
        chunks = split_stages(layers_of(model), [(0, 2), (3, len(layers_of(model)) - 1)])
        plain = chunks[1](*chunks[0](dense, pooled))
        with splitting_backward(chunks[0]), splitting_backward(chunks[1]):
            split = chunks[1](*chunks[0](dense, pooled))
        torch.testing.assert_close(split, plain, rtol=1e-5, atol=1e-6)
        # the first top layer: hollow (column 0 only) in the null model, the real product otherwise
        top0 = model.top.layer_pairs()[0][0]
        x = torch.randn(B, top0.in_features)
        x2 = x.clone()
        x2[:, 1:] += 1.0                          # changes nothing a hollow layer reads
        same = torch.equal(top0(x), top0(x2))
        assert same == hollow
