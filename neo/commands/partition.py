"""``neo partition PROFILE.json --stages S [--bandwidth-gbps G] [--devices N] [--speeds s0,s1,...] [--micro-batches M]``

Splits a layer profile (``neo profile-layers``) into S contiguous stages with the least
bottleneck (PipeDream's dynamic program, :mod:`neo.pipeline.partition`) and prints one JSON line::

    {"stages": [[0, 2], [3, 5]], "stage_ms": [1.9, 2.1], "bottleneck_ms": 2.1}

``--devices N`` (S <= N <= 4096) replicates stages too and adds ``"replicas": [...]`` (summing to N;
the dynamic program's time grows with N squared: 4096 devices take seconds);
``--speeds`` gives each stage's device speed (times scale by 1/speed); ``--micro-batches M`` adds
``"schedules"``: every schedule's predicted step and bubble (:mod:`neo.pipeline.perf_model`,
profile at the micro-batch size) and ``"best_schedule"``.

    neo partition profile.json --stages 4
    neo partition profile.json --stages 4 --devices 8 --bandwidth-gbps 25
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import List, Optional, Sequence

import numpy as np

from neo.pipeline.partition import PartitionError, Profile, load_profile, partition

_FLAGS = {"stages", "devices", "bandwidth_gbps", "speeds", "micro_batches", "virtual_stages"}

MAX_DEVICES = 4096
"""Most ``--devices``: the replicated split's dynamic program takes O(S L^2 N^2) time (4,000 devices
about 2 s, 8,000 about 8 s on a small profile; 100,000 would take about 20 minutes)."""


def _speeds(text: str) -> List[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected speeds such as 1,1,0.5, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neo partition",
                                description="Split a layer profile into pipeline stages (PipeDream's DP).")
    p.add_argument("profile", help="profile JSON (neo profile-layers --out)")
    p.add_argument("--stages", type=int, required=True, help="S, the number of pipeline stages")
    p.add_argument("--bandwidth-gbps", type=float, default=None, help="point-to-point GB/s (default: the profile's)")
    p.add_argument("--devices", type=int, default=None, help="N >= S devices: replicate stages (PipeDream)")
    p.add_argument("--speeds", type=_speeds, default=None, help="per-stage device speeds, e.g. 1,1,0.5,0.5")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="also predict every schedule's step with M micro-batches")
    p.add_argument("--virtual-stages", type=int, default=2, help="chunks per rank of interleaved_1f1b")
    return p


def _message(e: Exception) -> str:
    """A request error in the flags' words: ``--stages 12 exceeds the profile's 9 layers``."""
    if isinstance(e, PartitionError):
        base = e.field.split("[")[0]
        if base in _FLAGS:
            return f"--{base.replace('_', '-')}{e.field[len(base):]} {e.detail}"
    return str(e)


def _overflow(path: str, profile: Profile, bandwidth_gbps: Optional[float],
              speeds: Optional[Sequence[float]]) -> str:
    """Why no split has finite stage times although the flags allow one: the numbers overflow."""
    work = [l.fwd_ms + l.bwd_ms for l in profile.layers]
    total = sum(work)
    if not math.isfinite(total):
        return (f"profile {path!r}: its layers' fwd_ms + bwd_ms add up to more than a float holds "
                f"(overflow); profile again")
    least = min(work)
    for k, v in enumerate(speeds or ()):
        if not math.isfinite(least / v):
            return (f"--speeds[{k}] {v!r}: so slow that even the profile's fastest layer ({least:g} ms) takes an "
                    f"infinite time (overflow); give speeds nearer 1")
    bw = bandwidth_gbps or profile.bandwidth_gbps
    flag = "--bandwidth-gbps" if bandwidth_gbps else "the profile's bandwidth_gbps"
    bytes_ = max(max(2.0 * l.activation_bytes for l in profile.layers[:-1]) if len(profile.layers) > 1 else 0.0,
                 4.0 * sum(float(l.param_bytes) for l in profile.layers))
    if bw and not math.isfinite(bytes_ / (bw * 1e6)):
        return f"{flag} {bw!r}: the profile's transfers take an infinite time at this bandwidth (overflow)"
    return ("the stage times overflow (not finite) with this profile's layer times, --speeds and bandwidth; "
            "check them")


def main(argv: Optional[List[str]] = None) -> int:
    from neo.pipeline.perf_model import PIPELINE_SCHEDULES, SCHEDULES, best_schedule, predict, stage_times

    args = _parser().parse_args(argv)
    try:
        profile = load_profile(args.profile)
    except PartitionError as e:
        where = "" if e.field == "profile" else f"profile {args.profile!r}: "
        print(f"neo partition: error: {where}{e}", file=sys.stderr)
        return 2
    if args.devices is not None and args.devices > MAX_DEVICES:
        print(f"neo partition: error: --devices {args.devices}: at most {MAX_DEVICES} (the replicated split's "
              "time grows with the square of the devices)", file=sys.stderr)
        return 2
    try:
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # an overflow is named below
                part = partition(profile, args.stages, args.bandwidth_gbps, args.devices, args.speeds)
        except PartitionError as e:
            if e.field == "stages" and e.detail.startswith("no split"):   # the flags allow a split: an overflow
                print(f"neo partition: error: {_overflow(args.profile, profile, args.bandwidth_gbps, args.speeds)}",
                      file=sys.stderr)
                return 2
            raise
        out = {"stages": [list(s) for s in part.stages], "stage_ms": part.stage_ms, "bottleneck_ms": part.bottleneck_ms}
        if args.devices is not None:
            out["replicas"] = part.replicas
        if args.micro_batches is not None:
            if args.micro_batches < 1:
                raise PartitionError("micro_batches", f"must be >= 1, got {args.micro_batches}")
            L, v = len(profile.layers), args.virtual_stages
            if v < 1:
                raise PartitionError("virtual_stages", f"must be >= 1, got {v}")
            if args.stages * v > L:      # what parallel.pipeline refuses: more model chunks than layers
                raise PartitionError("virtual_stages", f"{v} x {args.stages} stages = {args.stages * v} model chunks, "
                                                       f"but the profile has only {L} layers")
            st = stage_times(profile, part, args.bandwidth_gbps, args.speeds)
            bw = args.bandwidth_gbps or profile.bandwidth_gbps
            kw = dict(comm_ms=st.comm_ms, virtual_stages=args.virtual_stages, stage_param_bytes=st.param_bytes,
                      bandwidth_gbps=bw)
            preds = {}
            for name in SCHEDULES:
                if name == "interleaved_1f1b" and args.virtual_stages < 2:
                    continue                 # one chunk a rank is plain 1f1b (the config refuses it)
                try:
                    pr = predict(name, st.fwd_ms, st.bwd_ms, args.micro_batches, **kw)
                except ValueError as e:
                    if not str(e).startswith(f"{name}:"):
                        raise
                    continue
                preds[name] = {"step_ms": pr.step_ms, "bubble_fraction": pr.bubble_fraction}
            out["schedules"] = preds
            fits = tuple(n for n in PIPELINE_SCHEDULES if n != "interleaved_1f1b" or args.virtual_stages >= 2)
            out["best_schedule"] = best_schedule(st.fwd_ms, st.bwd_ms, args.micro_batches, candidates=fits, **kw)[0]
    except ValueError as e:
        print(f"neo partition: error: {_message(e)}", file=sys.stderr)
        return 2
    try:
        text = json.dumps(out, allow_nan=False)
    except ValueError:                 # a profile's times so large that the sums overflow
        print(f"neo partition: error: profile {args.profile!r}: its layer times overflow the predictions "
              "(not finite); profile again", file=sys.stderr)
        return 2
    print(text)
    return 0
