"""A DLRM's dense head eager and under ``torch.compile`` (Inductor), Neo's and plain PyTorch's, side by side.

    python tools/bench_compile.py                          # MLPerf DLRM's head, B 2048, 1 thread
    python tools/bench_compile.py --quick                  # small shapes, a smoke test
    python tools/bench_compile.py --threads 1,2 --json bench_out/compile.json

The work: one training step's forward and backward of ``head(dense, pooled)`` (bottom MLP, dot
interaction, top MLP; MLPerf DLRM's sizes by default: bottom 13-512-256-128, top 1024-1024-512-256-1,
F = 26 features of D = 128) with a binary cross-entropy loss, gradients to every parameter and to
the pooled embeddings (as in training, where they flow on to the lookup). Systems, same weights:

- ``neo``: :class:`neo.models.DLRM`'s ``head`` eagerly (the fused interaction and bias + ReLU kernels);
- ``neo-compiled``: the same module under ``torch.compile`` (Inductor; the interaction the custom
  op ``neo::dot_interaction_fused``, the MLPs plain layers that Inductor fuses);
- ``torch``: the same function in plain PyTorch (``nn.Linear`` + ``nn.ReLU``, the interaction as a
  concatenation, one ``bmm`` and a gather of the upper triangle: ``DotInteraction(kernel="torch")``);
- ``torch-compiled``: that module under ``torch.compile`` (Inductor compiles the interaction too).

Systems alternate (``bench_common.time_interleaved``); medians over ``--iters``. Before timing, every
system's logits and pooled gradient are checked against ``neo``'s (fp32 tolerance). Prints ms per
step and ratios; ``--json`` writes the records with the machine (CPU model, ISA) and the compile
times.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from bench_common import (add_timing_args, apply_quick, positive_int, positive_int_list,  # noqa: E402
                          start_one_process, time_interleaved, write_json)

DEFAULTS = dict(batch=2048, features=26, dim=128, bottom=[512, 256, 128], top=[1024, 1024, 512, 256, 1])
QUICK = dict(batch=256, features=8, dim=16, bottom=[32, 16], top=[32, 1])
TOLERANCE = 1e-4


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p, features_help="F pooled features")
    return parse_model_args(p, argv, DEFAULTS, QUICK)


def add_model_args(p: argparse.ArgumentParser, features_help: str) -> None:
    """The DLRM's shape and the timing flags (shared with tools/bench_export.py)."""
    p.add_argument("--batch", type=positive_int, default=None)
    p.add_argument("--features", type=positive_int, default=None, help=features_help)
    p.add_argument("--dim", type=positive_int, default=None, help="D; the bottom MLP's last size")
    p.add_argument("--bottom", type=positive_int_list, default=None, help="bottom MLP sizes, ending in D")
    p.add_argument("--top", type=positive_int_list, default=None, help="top MLP sizes, ending in 1")
    p.add_argument("--quick", action="store_true", help="small shapes and few iterations")
    add_timing_args(p, iters=20, warmup=3)


def parse_model_args(p: argparse.ArgumentParser, argv, defaults: dict, quick: dict) -> argparse.Namespace:
    args = p.parse_args(argv)
    apply_quick(args, defaults, quick)
    if args.bottom[-1] != args.dim or args.top[-1] != 1:
        p.error(f"--bottom must end in --dim ({args.dim}) and --top in 1, got {args.bottom} and {args.top}")
    return args


def plain_head(model):
    """The same function as ``model.head`` in plain PyTorch, on copies of its parameters."""
    import torch
    from torch import nn

    from neo.models.interaction import DotInteraction

    def plain_mlp(mlp):
        layers = []
        for m in mlp:
            if isinstance(m, nn.Linear):
                layer = nn.Linear(m.in_features, m.out_features)
                layer.load_state_dict(m.state_dict())
                layers.append(layer)
            else:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    class PlainHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.bottom, self.top = plain_mlp(model.bottom), plain_mlp(model.top)
            self.interaction = DotInteraction(model.interaction.num_features, model.interaction.dim, kernel="torch")

        def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
            return self.top(self.interaction(self.bottom(dense), pooled)).squeeze(1)

    return PlainHead()


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = start_one_process(args)
    import torch

    from neo.models import DLRM

    warnings.filterwarnings("ignore", module="torch._inductor")
    torch.manual_seed(0)
    model = DLRM(torch.nn.Identity(), args.features, args.dim, 13, args.bottom, args.top)

    class Head(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, dense, pooled):
            return self.m.head(dense, pooled)

    modules = {"neo": Head(model), "neo-compiled": Head(copy.deepcopy(model)), "torch": plain_head(model)}
    modules["torch-compiled"] = copy.deepcopy(modules["torch"])
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(args.batch, 13, generator=gen)
    pooled = torch.randn(args.batch, args.features * args.dim, generator=gen).requires_grad_()
    labels = torch.rand(args.batch, generator=gen).round()
    records = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
        compile_s = {}
        run = {}
        for name, module in modules.items():
            fn = torch.compile(module) if name.endswith("-compiled") else module

            def step(fn=fn):
                pooled.grad = None
                logits = fn(dense, pooled)
                torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).backward()
                return logits, pooled.grad

            t0 = time.perf_counter()
            logits, grad = step()                          # compiles the compiled ones
            compile_s[name] = time.perf_counter() - t0
            if name == "neo":
                want_logits, want_grad = logits.detach().clone(), grad.clone()
            else:
                for what, got, want in (("logits", logits, want_logits), ("pooled gradient", grad, want_grad)):
                    err = (got - want).abs().max().item()
                    if err > TOLERANCE * max(want.abs().max().item(), 1e-30):
                        raise SystemExit(f"{name}: {what} differ from neo's by {err:.3g}")
            run[name] = step
        times = time_interleaved(run, args.warmup, args.iters)
        base = statistics.median(times["torch"].wall)
        for name in modules:
            ms = statistics.median(times[name].wall) * 1e3
            records.append(dict(system=name, threads=threads, batch=args.batch, features=args.features, dim=args.dim,
                                bottom=args.bottom, top=args.top, ms=ms, torch_over_system=base * 1e3 / ms,
                                first_call_s=compile_s[name], iters=args.iters, machine=machine))
    print(f"{'system':<16}{'threads':>8}{'ms/step':>10}{'torch / system':>16}{'first call s':>14}")
    for r in records:
        print(f"{r['system']:<16}{r['threads']:>8}{r['ms']:>10.2f}{r['torch_over_system']:>15.2f}x"
              f"{r['first_call_s']:>14.1f}")
    for threads in args.threads:
        by = {r["system"]: r["ms"] for r in records if r["threads"] == threads}
        print(f"threads={threads}: neo / neo-compiled {by['neo'] / by['neo-compiled']:.3f}x (> 1: compiled faster); "
              f"torch-compiled / neo-compiled {by['torch-compiled'] / by['neo-compiled']:.2f}x; "
              f"torch / neo {by['torch'] / by['neo']:.2f}x")
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
