"""DLRM's dot interaction: Neo's fused C++ kernel against the plain-PyTorch path (bmm), side by side.

    python tools/bench_interaction.py                              # n = 27, D = 64 and 128, B = 2048, 1 thread
    python tools/bench_interaction.py --isa avx2 --json bench_out/interaction_avx2.json
    python tools/bench_interaction.py --threads 1,2 --all-variants
    python tools/bench_interaction.py --processes 3 --no-torchrec    # three fresh processes, pooled

Both are ``neo.models.interaction.DotInteraction`` on the same fp32 tensors: ``kernel="auto"``
(``neo._C``'s fused forward and backward, csrc/kernels/interaction.h, in the ISA variant
chosen at import) and ``kernel="torch"`` (a concatenation, one ``bmm`` for the Gram matrix
and a gather of its upper triangle; the backward one ``bmm`` with the symmetrised pair
gradients). Shapes: F = 26 pooled features plus the dense vector (n = 27 vectors of D
floats per sample), B samples. Per iteration, each system runs forward (autograd on) and
backward with a fixed upstream gradient; systems alternate (each right after each other one
equally often, never right after itself: ``bench_common.call_orders``) so load from other jobs
hits both alike;
medians over ``--iters``. Before timing, the two outputs
and input gradients are checked to agree (fp32 tolerance). ``--all-variants`` also times
the fused kernel's lower ISA variants (those the --isa cap allows) and, in the AVX-512
kernels, the forward's other tilings at that D (``-narrow``: 8-float tiles of 4 x 4 pairs,
``-tall``: of 5 x 4, ``-wide``: 16-float tiles, ``-grouped``: rows interleaved in groups of
four), and in the AVX2 kernels the
other of ``-narrow`` (tiles of 2 x 4 pairs) and ``-tall`` (3 x 4). Each record says which
forward tiles ran (``forward_tiles``; ``NEO_INTERACTION_TILES``, csrc/cpu_isa.h).

The peer, where TorchRec is importable (``--no-torchrec`` leaves it out): ``torchrec``,
TorchRec's ``torchrec.models.dlrm.InteractionArch`` on the same tensors (the pooled input
viewed as (B, F, D)): a concatenation, one ``bmm``, the upper triangle gathered by two index
tensors and a second concatenation, with autograd's backward of each (the gather's is a
scatter into a zeroed (B, n, n) tensor, then two ``bmm``). Same output layout as Neo's (dense
first, then the pairs in row-major upper-triangle order); checked to agree before timing.

``--bounds``: also this machine's two floors for each shape, measured in the same run: the
arithmetic (the kernels' multiply-adds, B P D forward and 2 B P D backward, at the fp32 FMA peak
of the ISA Neo's kernels run, ``tools/bench_fma_peak.py``'s loop, times the threads) and the
memory traffic, measured: a system ``traffic`` joins the rotation, the kernels' reads and writes
alone (``neo._C.interaction_traffic_forward`` / ``_backward``, csrc/kernels/probe.h: forward n D
floats read and D + P written a sample, backward n D + D + P read and n D written, with the
kernels' stores, and no arithmetic), on the same tensors, timed like the others (so its inputs
come from where theirs do), without autograd. ``floor`` is the larger of the two (compute and
memory fully overlapped), ``serial`` their sum; ``torch / floor`` is the most any kernel that
reads its inputs and writes its outputs could be faster than the torch path here (records:
``bound_fma_ms``, ``bound_traffic_ms`` with ``bound_traffic_fwd_ms`` and ``bound_traffic_bwd_ms``,
``bound_floor_ms``, ``bound_serial_ms``, ``torch_over_floor``; and, where a record has a target,
``target_within_floor``: whether ``torch / floor`` reaches it, printed where it does not, since
then no kernel with these inputs and outputs meets the target in this run). For comparison, the same bytes at
the copy bandwidth of ``tools/bench_stream.py`` for a working set as large as both passes'
traffic, the next power of two MiB, with that many threads (``bound_memory_ms``,
``bound_copy_gb_s``, ``bound_working_set_mib``, ``torch_over_memory_model``): a model, which on
the Intel Xeon of 2026-11-29 came out below what the kernels' own pattern of reads and writes
takes. At one thread, Neo's kernels are also timed alone
(``neo._C``, no autograd) on as many samples as fit in 1 MiB (inputs, outputs and gradients:
61 at n 27, D 64; 33 at D 128), used again and again, whose data stay in L2 (the arithmetic
alone, ``kernel_in_l2_ms``), and on the B samples used again and again
(``kernel_from_memory_ms``: partly in the last-level cache, where the benchmark's own inputs
come from DRAM), both per B samples; each also per phase (``kernel_in_l2_fwd_ms``, ``kernel_in_l2_bwd_ms``,
``kernel_from_memory_fwd_ms``, ``kernel_from_memory_bwd_ms``) with its share of the FMA peak
(``kernel_in_l2_fwd_of_peak``, ``kernel_in_l2_bwd_of_peak``). These include each call's dispatch
and output allocation (a few microseconds).

Every process runs with ``neo.host_memory.retain_freed_memory()``, as training does.
Output: a table, torch / Neo and torchrec / Neo time ratios, and with ``--json`` records
(``speedup_vs_torch``, ``speedup_vs_torchrec``: the peer's median time over Neo's, per phase;
``speedup_vs_torch_paired``, ``speedup_vs_torchrec_paired``: per phase, the median over the
timed iterations of each iteration's ratio, the two systems having run one right after the
other: steadier on a shared machine, where a slow minute lands on both times of a pair;
``speedup_vs_torch_paired_ci95`` and ``speedup_vs_torchrec_paired_ci95``: per phase, a 95%
confidence interval of that median, distribution-free, from the order statistics of the
iterations' ratios, ``bench_common.median_ci``) with the machine (CPU model, ISA flags, the
--isa cap, the kernels' and ATen's ISA). ``--target`` (default 5, issue 15's) judges each Neo
record's paired forward + backward ratio over torch's path by that interval (``target_vs_torch``,
``target_verdict``): ``met`` where the whole interval is at or above the target, ``not met``
where it is below, ``undecided`` where it spans it (then more ``--iters`` narrow it).
``--processes N``: the whole measurement N times, each in a fresh process, one after another
(on the Zen 4 VM of 2026-12-07, in one run of ``--processes 3``, Neo's AVX-512 forward +
backward at D 64, one thread, took 4.24, 3.64 and 3.77 ms in its three processes, the paired
ratio over torch's path 4.83x, 5.09x and 5.29x: docs/benchmarks.md), and the records pooled:
per system and shape, every process's timed iterations together (medians, the paired ratios
each paired within its process, their interval and the verdict over all of them;
``processes``), and each process's own record, with its ratios, verdict and floors, in
``per_process``. The pooled interval treats the iterations as independent draws; where the
processes differ, their own figures say by how much. Every record keeps its timed iterations
(``iterations``: ``fwd_ms``, ``bwd_ms`` and ``after``, the system that ran just before each).
``fwd_bwd_ms_by_predecessor``: each system's median forward + backward time grouped by the
system that ran just before it (printed where they differ by more than 5%): what a call finds
in the caches and the memory map depends on it (on the Zen 4 VM of 2026-12-05, in the order used
before ``call_orders``, Neo's D 128 forward + backward took 6.6 ms right after itself and 7.5-7.6
after torch's path or TorchRec's, docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from bench_common import (add_isa_arg, apply_isa, describe_machine, interleaved, json_path,  # noqa: E402
                          machine_info, median_ci, multiple_of_list, nonneg_int, peer_version, positive_float,
                          positive_int, positive_int_list, quiet_peer_logs, start_rank, write_json)

import torch  # noqa: E402

ORDER = ("baseline", "avx2", "avx512")
PEERS = ("torch", "torchrec")   # the systems Neo's kernels are compared with; "torch" is the reference
TRAFFIC = "traffic"             # --bounds: the kernels' reads and writes alone (TrafficFloor)


def is_neo(system: str) -> bool:
    return system not in PEERS and system != TRAFFIC


class System:
    def __init__(self, name: str, module, isa=None, tiles=None):
        self.name, self.module, self.isa, self.tiles = name, module, isa, tiles
        self.times: Dict[str, List[float]] = {"fwd": [], "bwd": []}
        self.after: List[str] = []   # per timed iteration: the system that ran just before ("none": nothing)

    @contextlib.contextmanager
    def kernels(self) -> Iterator[None]:
        """The block runs with this system's ISA variant and forward tiles (where it sets them)."""
        from neo.cpp import use_cpu_isa, use_interaction_tiles

        with use_cpu_isa(self.isa) if self.isa else contextlib.nullcontext(), \
                use_interaction_tiles(self.tiles) if self.tiles else contextlib.nullcontext():
            yield

    def forward_tiles(self, D: int):
        """"narrow", "wide", "grouped" or "tall" (the fused kernel's forward at D), None for the peers."""
        from neo import _C

        if not is_neo(self.name):
            return None
        with self.kernels():
            return _C.interaction_forward_tiles(D)

    def step(self, dense, pooled, grad, record: bool) -> None:
        with self.kernels():
            self.timed(lambda: self.module(dense, pooled), lambda out: out.backward(grad), record)

    def timed(self, forward, backward, record: bool) -> None:
        """``backward(forward())``, each phase timed (kept where ``record``)."""
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        backward(out)
        t2 = time.perf_counter()
        if record:
            self.times["fwd"].append(t1 - t0)
            self.times["bwd"].append(t2 - t1)


class TrafficFloor(System):
    """The fused kernels' reads and writes alone (``neo._C.interaction_traffic_forward`` and
    ``_backward``, csrc/kernels/probe.h: the same bytes, no arithmetic), called directly (no
    autograd), on the benchmark's tensors in its rotation: the least time any kernel that
    reads the inputs and writes the outputs could take here."""

    def __init__(self, F: int):
        super().__init__(TRAFFIC, None)
        self.F = F

    def step(self, dense, pooled, grad, record: bool) -> None:
        from neo import _C

        self.timed(lambda: _C.interaction_traffic_forward(dense, pooled, self.F),
                   lambda _: _C.interaction_traffic_backward(grad, dense, pooled, self.F), record)


class TorchRecInteraction:
    """TorchRec's ``InteractionArch`` called as Neo's modules are: (dense (B, D), pooled (B, F D))."""

    def __init__(self, F: int, D: int):
        from torchrec.models.dlrm import InteractionArch

        self.arch, self.F, self.D = InteractionArch(num_sparse_features=F), F, D

    def __call__(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.arch(dense, pooled.view(-1, self.F, self.D))                       # (B, D + P)


def torchrec_available() -> bool:
    quiet_peer_logs()
    return peer_version("torchrec", "torchrec.models.dlrm") is not None


def systems_for(F: int, D: int, all_variants: bool, torchrec: bool, traffic: bool) -> List[System]:
    from neo import _C
    from neo.cpp import use_interaction_tiles
    from neo.models.interaction import DotInteraction

    active = _C.cpu_isa()
    out = [System(f"neo-{active}", DotInteraction(F, D))]
    if all_variants:   # the forward's other tilings at D (AVX-512, AVX2), and the lower variants the cap allows
        ran = {_C.interaction_forward_tiles(D)}
        for tiles in ("narrow", "wide", "grouped", "tall"):
            with use_interaction_tiles(tiles):
                runs = _C.interaction_forward_tiles(D)   # "wide" below D 96 runs narrow; each ISA its own tilings
            if runs not in ran:
                ran.add(runs)
                out.append(System(f"neo-{active}-{runs}", DotInteraction(F, D), tiles=tiles))
        for isa in ORDER[:ORDER.index(active)]:
            out.append(System(f"neo-{isa}", DotInteraction(F, D), isa=isa))
    out.append(System("torch", DotInteraction(F, D, kernel="torch")))
    if torchrec:
        out.append(System("torchrec", TorchRecInteraction(F, D)))
    if traffic:
        out.append(TrafficFloor(F))
    return out


def check_agree(systems: List[System], dense, pooled, grad) -> None:
    """Every system against the torch path (the tests compare Neo's with float64)."""
    ref_sys = next(s for s in systems if s.name == "torch")
    ref = ref_sys.module(dense, pooled)
    ref_g = torch.autograd.grad(ref, (dense, pooled), grad)
    for s in systems:
        if s is ref_sys or s.name == TRAFFIC:
            continue
        s.step(dense, pooled, grad, record=False)
        out = s.module(dense, pooled)
        g = torch.autograd.grad(out, (dense, pooled), grad)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)
        for a, b in zip(g, ref_g):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)


def run_shape(args, D: int, threads: int, machine: dict) -> List[dict]:
    F, B = args.features, args.batch
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(D)
    dense = torch.randn(B, D, generator=gen).requires_grad_()
    pooled = torch.randn(B, F * D, generator=gen).requires_grad_()
    n = F + 1
    grad = torch.randn(B, D + n * (n - 1) // 2, generator=gen)
    systems = systems_for(F, D, args.all_variants, args.torchrec, args.bounds)
    check_agree(systems, dense, pooled, grad)
    # each system right after each other one equally often, never right after itself
    previous: Optional[str] = None
    for timed, j in interleaved(len(systems), args.warmup, args.iters):
        systems[j].step(dense, pooled, grad, record=timed)
        if timed:
            systems[j].after.append(previous or "none")
        previous = systems[j].name
        dense.grad = pooled.grad = None
    records = []
    for s in systems:
        ms = {p: 1e3 * statistics.median(t) for p, t in phase_times(s).items()}
        records.append(dict(system=s.name, features=F, n=n, dim=D, batch=B, threads=threads, **ms,
                            fwd_bwd_ms_by_predecessor=by_predecessor(s),
                            forward_tiles=s.forward_tiles(D), iters=args.iters, machine=machine,
                            iterations=dict(fwd_ms=[1e3 * t for t in s.times["fwd"]],
                                            bwd_ms=[1e3 * t for t in s.times["bwd"]], after=list(s.after))))
    add_paired(records, systems)
    return records


def pool_processes(runs: List[List[dict]], target: float) -> List[dict]:
    """The records of several processes' runs (each run_shape's records of every shape, the same
    systems and shapes in each) as one run's: per system, D and thread count, every process's
    timed iterations together (medians, times by predecessor, the paired ratios over the
    iterations of all processes, each paired within its process, their intervals and the
    verdict), ``processes``, and each process's own record in ``per_process`` (without its
    iterations and machine)."""
    def key(r: dict) -> tuple:
        return r["system"], r["dim"], r["threads"]

    shapes = list(dict.fromkeys((r["dim"], r["threads"]) for r in runs[0]))
    records: List[dict] = []
    for shape in shapes:
        systems, recs = [], []
        for first in (r for r in runs[0] if (r["dim"], r["threads"]) == shape):
            mine = [next(r for r in run if key(r) == key(first)) for run in runs]
            s = System(first["system"], None)
            for r in mine:
                s.times["fwd"] += [t / 1e3 for t in r["iterations"]["fwd_ms"]]
                s.times["bwd"] += [t / 1e3 for t in r["iterations"]["bwd_ms"]]
                s.after += r["iterations"]["after"]
            rec = {k: first[k] for k in ("system", "features", "n", "dim", "batch", "threads", "forward_tiles",
                                         "machine")}
            rec.update({p: 1e3 * statistics.median(t) for p, t in phase_times(s).items()},
                       fwd_bwd_ms_by_predecessor=by_predecessor(s), iters=len(s.after), processes=len(runs),
                       per_process=[{k: v for k, v in r.items() if k not in ("iterations", "machine")} for r in mine])
            systems.append(s)
            recs.append(rec)
        add_paired(recs, systems)
        records += recs
    add_verdicts(records, target)
    return records


def print_per_process(records: List[dict]) -> None:
    """Each Neo record's paired forward + backward ratio over torch's path in each process, with its verdict."""
    lines = []
    for r in records:
        if is_neo(r["system"]) and "speedup_vs_torch_paired" in r:
            lines.append(f"  {r['system']:<19} D={r['dim']:<4} threads={r['threads']}: " + ", ".join(
                f"{x['speedup_vs_torch_paired']['fwd_bwd_ms']:.2f}x" + (f" {x['target_verdict']}" if
                                                                       'target_verdict' in x else "")
                for x in r["per_process"]))
    if lines:
        print("\ntorch / neo per process (paired, fwd+bwd)")
        print("\n".join(lines))


def phase_times(s: System) -> Dict[str, List[float]]:
    """A system's timed iterations per phase, as the records name them: forward, backward and
    their sum, iteration by iteration."""
    return dict(fwd_ms=s.times["fwd"], bwd_ms=s.times["bwd"],
                fwd_bwd_ms=[a + b for a, b in zip(s.times["fwd"], s.times["bwd"])])


def by_predecessor(s: System) -> Dict[str, float]:
    """A system's median forward + backward ms over its timed iterations, grouped by the system
    that ran just before each (``System.after``)."""
    groups: Dict[str, List[float]] = {}
    for before, t in zip(s.after, phase_times(s)["fwd_bwd_ms"]):
        groups.setdefault(before, []).append(t)
    return {before: 1e3 * statistics.median(t) for before, t in sorted(groups.items())}


def add_paired(records: List[dict], systems: List[System]) -> None:
    """Each Neo record's ``speedup_vs_<peer>_paired``: per phase, the median over the timed
    iterations of the peer's time over Neo's in the same iteration (each system runs once per
    iteration, one right after the other), in place. A slow minute of the shared machine then
    weighs on both times of a pair instead of on one system's median alone."""
    by_name = {s.name: s for s in systems}
    for r in records:
        if not is_neo(r["system"]):
            continue
        neo = phase_times(by_name[r["system"]])
        for peer in PEERS:
            if peer in by_name:
                t = phase_times(by_name[peer])
                ratios = {p: [a / b for a, b in zip(t[p], neo[p])] for p in neo}
                r[f"speedup_vs_{peer}_paired"] = {p: statistics.median(x) for p, x in ratios.items()}
                r[f"speedup_vs_{peer}_paired_ci95"] = {p: list(median_ci(x)) for p, x in ratios.items()}


def target_verdict(ci: List[float], target: float) -> str:
    """``met`` where the whole 95% interval of the paired ratio is at or above ``target``, ``not met``
    where it is below, ``undecided`` where it spans the target (more --iters, or a quieter minute)."""
    return "met" if ci[0] >= target else "not met" if ci[1] < target else "undecided"


def add_verdicts(records: List[dict], target: float) -> None:
    """Each Neo record's ``target_vs_torch`` and ``target_verdict`` (forward + backward, paired), in place."""
    for r in records:
        ci = r.get("speedup_vs_torch_paired_ci95")
        if ci is not None:
            r["target_vs_torch"] = target
            r["target_verdict"] = target_verdict(ci["fwd_bwd_ms"], target)


def add_bounds(records: List[dict], isa: str) -> None:
    """The arithmetic and memory floors of each Neo record's shape (module doc), in place."""
    import tempfile

    import bench_fma_peak
    import bench_stream

    with tempfile.TemporaryDirectory(prefix="neo_fma_") as tmp:
        fma_per_s = bench_fma_peak.measure(isa, 30_000_000, 3, tmp)["fma_per_s"]
    bandwidth: Dict[tuple, float] = {}
    for r in records:
        if not is_neo(r["system"]):
            continue
        B, n, D, T = r["batch"], r["n"], r["dim"], r["threads"]
        P = n * (n - 1) // 2
        fwd_bytes, bwd_bytes = 4 * B * (n * D + D + P), 4 * B * (2 * n * D + D + P)
        mb = max(4, 1 << ((fwd_bytes + bwd_bytes) >> 20).bit_length())   # the working set, a power of two MiB
        if (mb, T) not in bandwidth:
            torch.set_num_threads(T)
            bandwidth[(mb, T)] = bench_stream.measure(mb)["copy"] * 1e9
        fma_ms = 1e3 * 3 * B * P * D / (fma_per_s * T)
        mem_ms = 1e3 * (fwd_bytes + bwd_bytes) / bandwidth[(mb, T)]
        torch_ms = next(x["fwd_bwd_ms"] for x in records if x["system"] == "torch" and x["dim"] == D
                        and x["threads"] == T)
        tr = next(x for x in records if x["system"] == TRAFFIC and x["dim"] == D and x["threads"] == T)
        floor_ms = max(fma_ms, tr["fwd_bwd_ms"])
        r.update(bound_fma_ms=fma_ms, bound_traffic_ms=tr["fwd_bwd_ms"], bound_traffic_fwd_ms=tr["fwd_ms"],
                 bound_traffic_bwd_ms=tr["bwd_ms"], bound_memory_ms=mem_ms, bound_floor_ms=floor_ms,
                 bound_serial_ms=fma_ms + tr["fwd_bwd_ms"], bound_isa=isa, bound_fma_per_s=fma_per_s * T,
                 bound_copy_gb_s=bandwidth[(mb, T)] / 1e9, bound_working_set_mib=mb,
                 torch_over_floor=torch_ms / floor_ms, torch_over_memory_model=torch_ms / mem_ms)
        if "target_vs_torch" in r:
            r["target_within_floor"] = r["torch_over_floor"] >= r["target_vs_torch"]
        if T == 1 and r["system"] == f"neo-{isa}":
            phases = kernel_in_and_out_of_cache(r["features"], D, B)
            for where, (fwd_ms, bwd_ms) in phases.items():
                r[f"kernel_{where}_ms"] = fwd_ms + bwd_ms
                r[f"kernel_{where}_fwd_ms"], r[f"kernel_{where}_bwd_ms"] = fwd_ms, bwd_ms
            fwd_fma_ms = fma_ms / 3   # the forward's B P D of the 3 B P D multiply-adds
            r["kernel_in_l2_fwd_of_peak"] = fwd_fma_ms / r["kernel_in_l2_fwd_ms"]
            r["kernel_in_l2_bwd_of_peak"] = 2 * fwd_fma_ms / r["kernel_in_l2_bwd_ms"]


def kernel_in_and_out_of_cache(F: int, D: int, B: int, l2_bytes: int = 1 << 20) -> Dict[str, tuple]:
    """Neo's fused forward and backward kernels alone (neo._C, no autograd), one thread, ms per B
    samples, as (forward, backward): ``in_l2`` on as many samples as fit in ``l2_bytes`` (their
    inputs, outputs and gradients), used again and again (the arithmetic alone), and
    ``from_memory`` on the B samples, used again and again too (they stay partly in the last-level
    cache; in the benchmark, where the torch path runs in between, inputs come from DRAM)."""
    from neo.cpp import cpu_kernels

    C = cpu_kernels("dot_interaction_forward")
    torch.set_num_threads(1)
    n = F + 1
    per_sample = 4 * (2 * n * D + 2 * (D + n * (n - 1) // 2))   # inputs and their gradients, output and its
    small = max(8, min(B, l2_bytes // per_sample))
    out = {}
    for where, b, reps in (("in_l2", small, max(400, 80_000 // small)), ("from_memory", B, 30)):
        g = torch.Generator().manual_seed(1)
        dense, pooled = torch.randn(b, D, generator=g), torch.randn(b, F * D, generator=g)
        grad = torch.randn(b, D + n * (n - 1) // 2, generator=g)
        best = [float("inf"), float("inf")]
        for _ in range(reps):
            t0 = time.perf_counter()
            C.dot_interaction_forward(dense, pooled, F)
            t1 = time.perf_counter()
            C.dot_interaction_backward(grad, dense, pooled, F)
            t2 = time.perf_counter()
            best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
        out[where] = tuple(1e3 * t * B / b for t in best)
    return out


def print_bounds(records: List[dict]) -> None:
    print("\nfloors (fwd+bwd, ms): arithmetic at the FMA peak; memory: the kernels' traffic alone, measured "
          "(and as modelled from the copy bandwidth)")
    for r in records:
        if "bound_floor_ms" not in r:
            continue
        print(f"  {r['system']:<19} D={r['dim']:<4} threads={r['threads']}: FMA {r['bound_fma_ms']:5.2f} "
              f"({r['bound_fma_per_s'] / 1e9:.0f} G/s {r['bound_isa']}), traffic {r['bound_traffic_ms']:5.2f} "
              f"(fwd {r['bound_traffic_fwd_ms']:.2f}, bwd {r['bound_traffic_bwd_ms']:.2f}; model "
              f"{r['bound_memory_ms']:.2f} at {r['bound_copy_gb_s']:.1f} GB/s for {r['bound_working_set_mib']} MiB); "
              f"floor {r['bound_floor_ms']:5.2f}, serial {r['bound_serial_ms']:5.2f}; "
              f"torch / floor {r['torch_over_floor']:.2f}x")
        print(f"    Neo {r['fwd_bwd_ms']:5.2f} = {r['fwd_bwd_ms'] / r['bound_floor_ms']:.2f}x the floor (forward "
              f"{r['fwd_ms'] / r['bound_traffic_fwd_ms']:.2f}x, backward {r['bwd_ms'] / r['bound_traffic_bwd_ms']:.2f}x "
              f"their traffic)")
        if r.get("target_within_floor") is False:
            print(f"    the {r['target_vs_torch']:g}x target is beyond this run's floor: a kernel at the floor "
                  f"would be {r['torch_over_floor']:.2f}x torch's path")
        if "kernel_in_l2_ms" in r:
            print(f"    its kernels alone: {r['kernel_in_l2_ms']:5.2f} with the data in L2 "
                  f"({r['bound_fma_ms'] / r['kernel_in_l2_ms']:.0%} of the FMA peak; forward "
                  f"{r['kernel_in_l2_fwd_ms']:.2f} at {r['kernel_in_l2_fwd_of_peak']:.0%}, backward "
                  f"{r['kernel_in_l2_bwd_ms']:.2f} at {r['kernel_in_l2_bwd_of_peak']:.0%}), "
                  f"{r['kernel_from_memory_ms']:5.2f} on the {r['batch']} samples (forward {r['kernel_from_memory_fwd_ms']:.2f}, "
                  f"backward {r['kernel_from_memory_bwd_ms']:.2f})")


def print_records(records: List[dict]) -> None:
    print(f"\n{'system':<19} {'n':>3} {'D':>4} {'B':>5} {'threads':>7} {'tiles':>6} {'fwd ms':>8} {'bwd ms':>8} "
          f"{'fwd+bwd':>8}")
    for r in records:
        tiles = r["forward_tiles"] or "-"
        print(f"{r['system']:<19} {r['n']:>3} {r['dim']:>4} {r['batch']:>5} {r['threads']:>7} {tiles:>6} "
              f"{r['fwd_ms']:>8.2f} {r['bwd_ms']:>8.2f} {r['fwd_bwd_ms']:>8.2f}")
    print_by_predecessor(records)
    for peer in PEERS:
        if not any(r["system"] == peer for r in records):
            continue
        print(f"\n{peer} / neo (time ratio; > 1: Neo faster)")
        for r in records:
            if not is_neo(r["system"]):
                continue
            t = next(x for x in records if x["system"] == peer and x["dim"] == r["dim"] and x["threads"] == r["threads"])
            sp = r[f"speedup_vs_{peer}"] = {p: t[p] / r[p] for p in ("fwd_ms", "bwd_ms", "fwd_bwd_ms")}
            line = (f"  {r['system']:<19} D={r['dim']:<4} threads={r['threads']}: fwd {sp['fwd_ms']:5.2f}x  "
                    f"bwd {sp['bwd_ms']:5.2f}x  fwd+bwd {sp['fwd_bwd_ms']:5.2f}x")
            paired = r.get(f"speedup_vs_{peer}_paired")
            if paired:
                ci = r.get(f"speedup_vs_{peer}_paired_ci95", {}).get("fwd_bwd_ms")
                line += (f"  (paired: median of the iterations' ratios {paired['fwd_bwd_ms']:5.2f}x"
                         + (f", 95% CI {ci[0]:.2f}-{ci[1]:.2f}" if ci else "") + ")")
            if peer == "torch" and "target_verdict" in r:
                line += f"  {r['target_vs_torch']:g}x: {r['target_verdict']}"
            print(line)


def print_by_predecessor(records: List[dict], spread: float = 1.05) -> None:
    """The records whose forward + backward medians by predecessor differ by more than ``spread``."""
    lines = []
    for r in records:
        by = r.get("fwd_bwd_ms_by_predecessor") or {}
        if len(by) > 1 and max(by.values()) > spread * min(by.values()):
            lines.append(f"  {r['system']:<19} D={r['dim']:<4} threads={r['threads']}: "
                         + ", ".join(f"after {k} {v:.2f}" for k, v in by.items()))
    if lines:
        print("\nfwd+bwd ms by the system run just before (where they differ by more than "
              f"{spread - 1:.0%})")
        print("\n".join(lines))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--features", type=positive_int, default=26, help="pooled features F (n = F + 1 vectors)")
    p.add_argument("--dims", type=multiple_of_list(4), default=[64, 128],
                   help="comma-separated embedding dims (positive multiples of 4, as Neo's tables need)")
    p.add_argument("--batch", type=positive_int, default=2048)
    p.add_argument("--threads", type=positive_int_list, default=[1], help="comma-separated thread counts, e.g. 1,2")
    p.add_argument("--iters", type=positive_int, default=30)
    p.add_argument("--warmup", type=nonneg_int, default=10,
                   help="untimed iterations first: on the VM the first touches of freshly allocated memory are slow")
    p.add_argument("--all-variants", action="store_true", help="also time the fused kernel's lower ISA variants")
    p.add_argument("--bounds", action="store_true", help="also measure this machine's arithmetic and memory floors")
    p.add_argument("--no-torchrec", dest="torchrec", action="store_false",
                   help="leave out TorchRec's InteractionArch (it is left out with a note where not importable)")
    p.add_argument("--target", type=positive_float, default=5.0,
                   help="the paired forward + backward ratio over torch's path to judge (issue 15: 5x): met, "
                        "not met or undecided by its 95%% interval")
    p.add_argument("--processes", type=positive_int, default=1,
                   help="run the whole measurement in this many fresh processes, one after another, and pool "
                        "their timed iterations (each process's figures printed and kept in per_process)")
    add_isa_arg(p)
    p.add_argument("--json", metavar="FILE", type=json_path)
    return p


def child_argv(args: argparse.Namespace) -> List[str]:
    """The command line of one measuring process of --processes: every option of ``args`` but
    --processes and --json."""
    argv = ["--features", str(args.features), "--dims", ",".join(map(str, args.dims)), "--batch", str(args.batch),
            "--threads", ",".join(map(str, args.threads)), "--iters", str(args.iters), "--warmup", str(args.warmup),
            "--target", repr(args.target), "--isa", args.isa]
    return argv + [flag for flag, on in (("--all-variants", args.all_variants), ("--bounds", args.bounds),
                                         ("--no-torchrec", not args.torchrec)) if on]


def run_processes(args: argparse.Namespace) -> int:
    """--processes N: the script itself N times, one after another, each in a fresh process with
    its own records (a temporary JSON); then the pooled records (pool_processes)."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="neo_bench_interaction_") as tmp:
        for k in range(args.processes):
            print(f"== process {k + 1} of {args.processes}", flush=True)
            path = os.path.join(tmp, f"{k}.json")
            rc = subprocess.call([sys.executable, os.path.abspath(__file__), *child_argv(args), "--json", path])
            if rc != 0:
                print(f"process {k + 1} of {args.processes} failed (exit status {rc}): nothing pooled")
                return rc
            with open(path) as f:
                runs.append(json.load(f))
    records = pool_processes(runs, args.target)
    print(f"\n== pooled: the {args.processes} processes' timed iterations together")
    print_records(records)
    print_per_process(records)
    if args.bounds:
        print("(--bounds: each process's floors are in its own records, per_process)")
    if args.json:
        write_json(args.json, records)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    apply_isa(args.isa)
    if args.processes > 1:
        return run_processes(args)
    start_rank(1, system_malloc=False)
    machine = machine_info(args.isa)
    print(describe_machine(machine))
    if args.torchrec and not torchrec_available():
        print("note: torchrec is not importable here: its InteractionArch is left out")
        args.torchrec = False
    records = []
    for threads in args.threads:
        for D in args.dims:
            records += run_shape(args, D, threads, machine)
    add_verdicts(records, args.target)
    print_records(records)
    if args.bounds and machine["neo_cpu_isa"] not in ("avx2", "avx512"):
        # the FMA probe (bench_fma_peak) times vector FMAs: the baseline kernels have no such floor
        print(f"note: --bounds left out: the FMA floor is measured for avx2 and avx512, these kernels run "
              f"{machine['neo_cpu_isa']}")
        for r in records:
            r["bounds_note"] = f"no FMA floor for the {machine['neo_cpu_isa']} kernels"
    elif args.bounds:
        add_bounds(records, machine["neo_cpu_isa"])
        print_bounds(records)
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
