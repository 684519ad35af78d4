"""``neo profile-layers CONFIG [--out PROFILE.json] [--batch-size B] [--repeats R] [key=value ...]``

Builds the config's dense model (bottom MLP, interaction, top MLP; :mod:`neo.pipeline.layers`),
measures every layer's forward and backward time, activation and parameter bytes on this
device, and writes the profile ``neo partition`` reads::

    {"layers": [{"name": "bottom.0", "fwd_ms": 0.05, "bwd_ms": 0.09, "activation_bytes": 24576,
                 "param_bytes": 320}, ...],
     "bandwidth_gbps": 4.1, "bandwidth_source": "measured: gloo send/recv ...", "batch_size": 128, ...}

    neo profile-layers configs/train_tiny.yaml --out profile.json
    neo profile-layers configs/mlperf_dcnv2_cpu.yaml --batch-size 2048 --repeats 20 --out dcnv2.json
    neo profile-layers configs/train_tiny.yaml --bandwidth constants     # no measurement

Bandwidth: ``--bandwidth-gbps G``; else ``--bandwidth measure`` (default: gloo send/recv of 4 MiB
between 2 local processes) or ``--bandwidth constants`` (the planner's ``intra_bw``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from neo.commands.arg_types import output_problem, positive_float, positive_int
from neo.config import ConfigError, load_config

MAX_BATCH = 1 << 24
"""Most ``--batch-size``: 16,777,216 samples (a layer's activations at 16 Mi samples already fill
tens of GiB); a smaller batch whose inputs alone exceed the free memory is refused too."""
MAX_THREADS = 4 * (os.cpu_count() or 1)
"""Most ``--threads``: 4 x this machine's CPUs (torch crashes on a huge thread count)."""


def _bounded_int(low: int, high: int, why: str):
    def parse(text: str) -> int:
        v = positive_int(text)
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}] ({why}), got {v}")
        return v
    return parse


def _free_bytes(device) -> Optional[int]:
    """Memory free for tensors on ``device`` (None: unknown)."""
    import torch

    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neo profile-layers",
                                description="Measure each dense layer's time and bytes (PipeDream's profiler).")
    p.add_argument("config", help="Neo YAML config (model and tables sections)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.interaction=dcn")
    p.add_argument("--out", default=None, help="write the profile JSON here (default: print it)")
    p.add_argument("--batch-size", type=_bounded_int(1, MAX_BATCH, "samples"), default=None,
                   help=f"batch (or micro-batch) size to profile at, at most {MAX_BATCH} (default: train.batch_size)")
    p.add_argument("--repeats", type=positive_int, default=10, help="timed runs per layer; the median is kept")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per layer first")
    p.add_argument("--num-dense", type=positive_int, default=None,
                   help="dense input features (default: data.synthetic.num_dense)")
    p.add_argument("--threads", type=_bounded_int(1, MAX_THREADS, f"4 x this machine's {os.cpu_count() or 1} CPUs"),
                   default=None,
                   help=f"torch intra-op threads while profiling, 1 to {MAX_THREADS} (default: 1 on CPU, as each rank "
                        "of a gloo pipeline runs; torch's default on a GPU)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--bandwidth-gbps", type=positive_float, default=None,
                   help="point-to-point bandwidth between stages, GB/s (skips --bandwidth)")
    p.add_argument("--bandwidth", choices=("measure", "constants"), default="measure",
                   help="measure a gloo send/recv between 2 local processes, or take the planner's intra_bw")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    import torch

    from neo.pipeline.layers import dense_layers
    from neo.pipeline.profile import (bandwidth_from_constants, build_profile, measure_p2p_bandwidth,
                                      profile_layers)

    args = _parser().parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        dims = [t.dim for t in cfg.tables]
        if not dims:
            raise ConfigError("tables: the dense model needs the tables (their features and dim)")
        cfg.model.check_tables(dims)
        spec = cfg.dense_spec(args.num_dense)
        batch = args.batch_size or cfg.train.batch_size
        try:
            device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        except RuntimeError as e:
            raise ConfigError(f"--device {args.device!r}: not a device torch knows (cpu or cuda): {e}") from None
        if device.type not in ("cpu", "cuda"):
            raise ConfigError(f"--device {args.device}: the layers are profiled on cpu or cuda")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"--device {args.device}: this torch has no CUDA device (built without CUDA, or "
                              "none visible): use --device cpu")
        if args.out:              # found now, not after the profiling
            why = output_problem(args.out)
            if why:
                raise ConfigError(f"--out {args.out}: {why}")
        free = _free_bytes(device)
        inputs = 2 * 4 * batch * (spec.num_dense + spec.num_features * spec.dim)   # the inputs and their gradient
        if free is not None and inputs > free:
            raise ConfigError(f"--batch-size {batch}: its inputs and their gradients alone need "
                              f"{inputs / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB free on {device}; "
                              "profile a smaller batch")
        if args.bandwidth_gbps is not None:
            bw, source = args.bandwidth_gbps, "--bandwidth-gbps"
        elif args.bandwidth == "constants":
            bw, source = bandwidth_from_constants(cfg)
        else:
            bw, source = None, None
    except (ConfigError, ValueError, RuntimeError) as e:
        print(f"neo profile-layers: error: {e}", file=sys.stderr)
        return 2
    if args.warmup < 0:
        print("neo profile-layers: error: --warmup must be >= 0", file=sys.stderr)
        return 2
    threads = args.threads or (1 if device.type == "cpu" else torch.get_num_threads())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        layers = dense_layers(cfg.model, spec.num_dense, spec.num_features, spec.dim)
        rows = profile_layers(layers, batch, spec.num_dense, spec.num_features * spec.dim, args.repeats,
                              args.warmup, device)
    except RuntimeError as e:         # torch.OutOfMemoryError included
        if not (isinstance(e, getattr(torch, "OutOfMemoryError", ())) or "allocate" in str(e)
                or "out of memory" in str(e)):
            raise
        print(f"neo profile-layers: error: --batch-size {batch}: out of memory on {device} while profiling "
              f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); profile a smaller batch", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(before)
    if bw is None:
        try:
            bw = measure_p2p_bandwidth()
            source = "measured: gloo send/recv of 4 MiB between 2 local processes (median of 5, one way)"
        except RuntimeError as e:
            bw, source = bandwidth_from_constants(cfg)
            source += f"; the measurement failed: {e}"
    profile = build_profile(rows, bw, bandwidth_source=source, batch_size=batch, device=str(device),
                            repeats=args.repeats, threads=threads, config=args.config,
                            num_dense=spec.num_dense, num_features=spec.num_features, dim=spec.dim,
                            interaction=spec.interaction)
    text = json.dumps(profile.to_dict(), indent=1)
    if not args.out:
        print(text)
        return 0
    try:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    except OSError as e:
        print(f"neo profile-layers: error: --out {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"{'layer':16s} {'fwd ms':>9s} {'bwd ms':>9s} {'act bytes':>12s} {'param bytes':>12s}")
    for r in rows:
        print(f"{r.name:16s} {r.fwd_ms:9.4f} {r.bwd_ms:9.4f} {r.activation_bytes:12,d} {r.param_bytes:12,d}")
    print(f"bandwidth {bw:.2f} GB/s ({source}); batch {batch} on {device}")
    print(f"profile written to {args.out}")
    return 0
