"""neo.train.trainer.dense_optimizer (torch's fused kernels) against torch.optim's per-tensor loop."""

from types import SimpleNamespace

import pytest
import torch

from neo.train.trainer import dense_optimizer


@pytest.mark.parametrize("kind,acc0", [("sgd", 0.0), ("adagrad", 0.0), ("adagrad", 0.1), ("adam", 0.0)])
def test_dense_optimizer_is_fused_and_matches_the_loop_implementation(kind, acc0):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(50, 7)), torch.nn.Parameter(torch.randn(7))]
    ref = [p.detach().clone().requires_grad_() for p in params]
    cfg = SimpleNamespace(type=kind, lr=0.01, momentum=0.9, weight_decay=0.01, eps=1e-8, betas=(0.9, 0.999),
                          initial_accumulator_value=acc0)
    opt = dense_optimizer(cfg, params)
    assert opt.defaults["fused"] is True
    kw = dict(lr=0.01, weight_decay=0.01, foreach=False)
    loop = {"sgd": lambda: torch.optim.SGD(ref, momentum=0.9, **kw),
            "adagrad": lambda: torch.optim.Adagrad(ref, eps=1e-8, initial_accumulator_value=acc0, **kw),
            "adam": lambda: torch.optim.Adam(ref, eps=1e-8, **kw)}[kind]()
    for _ in range(5):
        for p, q in zip(params, ref):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        loop.step()
    for p, q in zip(params, ref):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-6)
