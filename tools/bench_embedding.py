"""Benchmark Neo's CPU embedding kernels against FBGEMM's CPU TBE and plain PyTorch.

    python tools/bench_embedding.py                     # default workload (~13 GB of RAM, a few minutes)
    python tools/bench_embedding.py --quick             # small smoke test, well under a minute
    python tools/bench_embedding.py --quick --iters 1   # --quick only fills in flags not given explicitly
    python tools/bench_embedding.py --threads 1,2 --iters 10 --json bench.json
    python tools/bench_embedding.py --isa avx2          # every system capped at AVX2 (tools/bench_common.py)
    python tools/bench_embedding.py --weighted          # per-id weights (below)
    python tools/bench_embedding.py --learnable-weights # per-id weights that require grad (below)
    python tools/bench_embedding.py --dtypes fp32 --neo-tuning bwd_lookahead=16 --neo-tuning sort_prefetch=1

Workload (defaults): 8 tables of 1M rows, D = 64, fp32 and fp16 weights (``--dtypes``: only
fp32 and fp16 are accepted; bf16 is refused, FBGEMM's CPU TBE would run it in fp32),
batch 4096, one feature per table; bag lengths uniform in 1 .. 2 * pooling_factor - 1
(mean = pooling factor, 20), ids uniform in [0, rows) (``--skew S``: Zipf(S), as production ids
are, the hot rows scattered over each table); sum pooling; row-wise Adagrad (lr
0.01, eps 1e-8).

The machine's limit is measured in the same run: ``probe`` is the gather probe of
``tools/bench_gather_probe.py`` (the plainest random-row gather: no bags, no output, the ids'
range checked in its loop, summed in registers) over a table as large as the workload's (8 x 1M
rows: 2 GiB fp32, on huge pages), reading exactly the rows each batch reads (table t's ids
offset by t x rows), in the same order, with six prefetch settings (none; 8 or 16 ids ahead into
L1 alone; 16 ids ahead into L1 and 128 into L2; 32 and 256; 64 and 512: on the AMD EPYC Zen 3 of
2026-11-30 an L1-only one was the fastest, on the Intel Xeons a far one). First the settings are
timed in turn, each call right after a forward of a system on tables of its own (FBGEMM, else
PyTorch, else Neo; ``choose_probe``: every setting's median in the probe record's
``probe_settings_ms``). The fastest (``probe_prefetch``) then runs in the rotation with the
systems: its speed there is the limit, and every system's forward lookups/s is reported as a
fraction of it (``fraction_of_probe``, the "of probe" column). In the rotation every runner has
tables of its own, so each call finds its tables as last read a whole round earlier. Until
2026-12-05 all six settings ran in the rotation on their one table, and ``neo`` and
``neo-noval`` on one module: a call soon after another over the same tables found them warm
(in the caches, and the translations of their pages; on the AMD EPYC Zen 5 VM of 2026-12-05,
fp16 rows, one thread, Neo's forward took 2.4-2.6 ms right after one on its tables, 2.5-2.8 ms
with one or two other systems' gathers between after a run of its own calls, 3.2-3.6 ms in the
rotation's other calls: docs/benchmarks.md), so the probe read faster than the systems, and
Neo's and its twin's medians swung with how many of their calls followed each other. The best setting is then also
timed alone, its calls back to back (``probe_alone_lookups_per_s``, and each forward's
``fraction_of_probe_alone``: the "of alone" column), the limit a gather finds with its table
warm. Last, Neo's forward and the best setting are timed in one state (``time_phase``'s ``peer``):
each call right after a forward of a peer on tables of its own (FBGEMM, else PyTorch), the two
in turn, so that each finds its table as the other finds its own; FBGEMM's forward likewise,
with Neo's forward as the peer. Such a record then holds both speeds
(``same_state_lookups_per_s``, ``probe_same_state_lookups_per_s``) and their ratio
(``fraction_of_probe_same_state``: the "same st." column); without a peer, None. It checks the
rotation: since every runner there has tables of its own, the two fractions agree (within a few
percent on the AMD EPYC Zen 5 VM of 2026-12-05).

The memory latency (``latency_ns`` in every forward record) is measured on the probe's table
before the rotation (``bench_gather_probe.memory_latency_ns``: dependent reads after a write pass over
twice the last-level cache), and each forward's ``lines_in_flight`` (the "in flight" column) is
its lookups/s x the row's cache lines x that latency: the misses it keeps in flight on average
(Little's law), beside the probe's and what one core can track (``bench_gather_probe.py``'s doc).

Backends, same tables, ids and offsets:

- ``neo``: ``TableBatchedEmbedding(tables, backend="cpu")`` with its default input
  validation ON (the honest configuration); ``neo-noval``: a second such module, timed with
  validate=False, on tables of its own (the same seed: the same start).
- ``fbgemm``: FBGEMM's CPU TBE (``SplitTableBatchedEmbeddingBagsCodegen``, HOST/CPU,
  EXACT_ROWWISE_ADAGRAD), skipped with a note where fbgemm_gpu is not importable.
- ``neo@NAME=K,...`` (``--neo-tuning NAME=K[,NAME=K]``, repeatable): one more such module each (2
  GiB more of tables, fp32, at the defaults), validate on,
  under other kernel settings (``neo._C._set_tuning``: prefetch distances, streaming stores; this
  CPU's defaults, ``neo._C._tuning()``, restored after each call), timed in the same rotation: how
  a setting compares with this CPU's default on this machine.
- ``torch``: 8 x ``nn.EmbeddingBag(mode="sum", sparse=True)`` + ``torch.optim.Adagrad``
  (per-element Adagrad: the closest stock PyTorch has; it does more work per row); fp32 only.

A peer left out (FBGEMM not importable; PyTorch in the fp16 table) is a printed note and a
record with ``note`` (and ``ms`` null) in the JSON. FBGEMM and PyTorch start from Neo's initial
tables (copied in), and before any timing every backend's forward on one batch is compared with
Neo's: ``max_abs_diff_vs_neo`` in each record, an error past 1e-5 (fp32) or 1e-3 (fp16) of Neo's
largest output (``FORWARD_TOLERANCE``).

fp16 tables: Neo stores fp16 and rounds its updates stochastically (the default); FBGEMM's
TBE with ``weights_precision=FP16`` (stochastic rounding, its default). Both pool in fp32.
Every system runs with ``neo.host_memory.retain_freed_memory()`` (freed outputs reused, not
page-faulted in again), as in the other benchmarks.

``--weighted``: every batch carries per-id weights (uniform in [0.5, 1.5)), which every system
multiplies into its rows and gradients. ``--learnable-weights`` (implies ``--weighted``): in
``fwd_bwd`` they also require grad (a fresh leaf each call, sharing their storage), as TorchRec's
position-weighted features do: each system also computes their gradient (Neo's
``weight_grad`` kernel, FBGEMM's ``grad_indice_weights``, ``nn.EmbeddingBag``'s
``per_sample_weights`` backward). Before timing, every system's gradient on one batch is compared
with Neo's (``max_abs_weight_grad_diff_vs_neo``, within ``FORWARD_TOLERANCE`` of Neo's largest);
the records say ``weighted`` and ``learnable_weights``. The probe stays the unweighted gather.

Phases: ``fwd`` (inference forward, no autograd) and ``fwd_bwd`` (forward, backward and
optimizer update). Each at every thread count (``torch.set_num_threads``): warm-up, then
``--iters`` timed iterations with the backends interleaved (iteration i of every backend
runs before iteration i + 1 of any, in an order that changes every iteration so that each
backend runs right after each other one equally often: ``bench_common.call_orders``), so
load on a shared machine hits all alike; the median is reported. Every call reads the next of
``BATCHES`` pre-generated batches (8 on the CPU: about 670 MB of fp16 rows read between two
reads of one batch), so no call finds its rows left in the last-level cache by the call
before it. (Until 2026-11-29 every backend of an iteration read the same batch: the probe's
four settings and ``neo`` / ``neo-noval`` then read rows the previous one had just brought
into L3, and FBGEMM, with its own table, never did.)

On a CUDA machine a separate section also times the ``triton`` backend against plain
PyTorch on the GPU (fp32; fp16 tables: Triton alone), the forward outputs compared first, and
reports achieved bandwidth as a share of a device-to-device copy, with the GPU's name in every
record (``--cuda-only``: that section alone)::

    python tools/bench_embedding.py --cuda-only --batch 32768 --iters 50 --json gpu.json
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from bench_common import (add_isa_arg, apply_isa, apply_quick, describe_machine, json_path,  # noqa: E402
                          machine_info, multiple_of, nonneg_float, nonneg_int, positive_int, positive_int_list,
                          start_rank, time_interleaved, write_json)
from embedding_systems import (BATCHES, Runner, fbgemm_runner, make_batches, neo_runners,  # noqa: E402
                               probe_runners, torch_runner)

# ----------------------------------------------------------------------------- timing
def time_phase(runners: List[Runner], phase: str, batches, warmup: int, iters: int,
               sync: Callable[[], None] = lambda: None, peer: Optional[Runner] = None) -> Dict[str, float]:
    """Median ms of each runner's ``phase`` (those that have it), timed interleaved (a new order
    every round, each backend right after each other one equally often: one that thrashes the
    caches, like the PyTorch baseline, slows the next one); a batch per call, so that its rows
    were not just read by another backend; ``sync`` before each call and, timed, after it.
    ``peer`` (the same-state pass): every call right after one untimed forward of it (a system on
    tables of its own), so that between two calls of one runner come as many gathers of the peer
    and of the other runners, whichever runner it is: all of them find their own tables in one
    state (caches, the host's translations)."""
    runners = [r for r in runners if getattr(r, phase) is not None]
    picks = itertools.count()

    def batch():
        return batches[next(picks) % len(batches)]

    def call(fn):
        def run():
            fn(batch())
            sync()
        return run

    def before():
        if peer is not None:
            peer.fwd(batch())
        sync()

    times = time_interleaved({r.name: call(getattr(r, phase)) for r in runners}, warmup, iters, before=before)
    return {name: statistics.median(t.wall) * 1e3 for name, t in times.items()}


def same_state_fields(times: Optional[Dict[str, float]], name: str, best: str, n_ids: float) -> dict:
    """A forward record's same-state fields from the same-state pass's medians (``times``: the
    system ``name`` and the probe setting ``best``; None: not measured for this record)."""
    if times is None:
        return dict(same_state_lookups_per_s=None, probe_same_state_lookups_per_s=None,
                    fraction_of_probe_same_state=None)
    return dict(same_state_lookups_per_s=n_ids / (times[name] / 1e3),
                probe_same_state_lookups_per_s=n_ids / (times[best] / 1e3),
                fraction_of_probe_same_state=times[best] / times[name])


def choose_probe(probes: List[Runner], selector: Runner, batches, args) -> Tuple[str, Dict[str, float]]:
    """The probe's fastest prefetch setting, and every setting's median ms: the settings timed
    interleaved (``time_phase`` with ``peer``), each call right after a forward of ``selector`` (a system
    on tables of its own), so that each finds the probe's table as the systems in the rotation
    find theirs, not just read by another setting (the module doc)."""
    ms = time_phase(probes, "fwd", batches, args.warmup, args.iters, peer=selector)
    return min(ms, key=ms.get), ms


def probe_readings(runners: List[Runner], best: str, peer: Optional[Runner], batches,
                   args) -> Tuple[float, Optional[Dict[str, Dict[str, float]]]]:
    """The probe's best setting beyond the rotation: alone, its calls back to back (ms: no other
    system's gather between them); and the same-state pass (``time_phase`` with ``peer``: Neo's forward
    and the probe each right after ``peer``'s, FBGEMM's and the probe each right after Neo's where
    FBGEMM is the peer), keyed by system (None without a peer)."""
    by_name = {r.name: r for r in runners}
    alone_ms = time_phase([by_name[best]], "fwd", batches, args.warmup, args.iters)[best]
    if peer is None:
        return alone_ms, None
    same = {"neo": time_phase([by_name[best], by_name["neo"]], "fwd", batches, args.warmup, args.iters, peer=peer)}
    if peer.name == "fbgemm":
        same["fbgemm"] = time_phase([by_name[best], by_name["fbgemm"]], "fwd", batches, args.warmup, args.iters,
                                    peer=by_name["neo"])
    return alone_ms, same


# Largest |output - Neo's| allowed in the forward check, relative to Neo's largest |output|: the same
# rows summed in another order (fp32: ~1e-7 a term); fp16 tables are read as the same fp16 values and
# pooled in fp32 too, but a peer may widen or round them its own way (fp16 keeps ~3 digits).
FORWARD_TOLERANCE = {"fp32": 1e-5, "fp16": 1e-3}


def forward_diffs(runners: List[Runner], batch, dtype: str, ref: str = "neo") -> Dict[str, float]:
    """Max |forward output - the ``ref`` backend's| of every backend on one batch, before any is
    timed (and any update moves the tables apart); a backend past FORWARD_TOLERANCE did other
    work: an error."""
    expected = next(r for r in runners if r.name == ref).fwd(batch).float()
    limit = FORWARD_TOLERANCE[dtype] * float(expected.abs().max())
    diffs = {}
    for r in runners:
        diffs[r.name] = float((r.fwd(batch).float() - expected).abs().max())
        if diffs[r.name] > limit:
            raise RuntimeError(f"{r.name} ({dtype}): forward output differs from {ref}'s by {diffs[r.name]:.3g} "
                               f"(allowed {limit:.3g}): not the same work")
    print(f"forward check ({dtype}): max |output - {ref}| " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    return diffs


def weight_grad_diffs(runners: List[Runner], batch, dtype: str, ref: str = "neo") -> Dict[str, float]:
    """``--learnable-weights``: max |gradient of the per-id weights - the ``ref`` backend's| of
    every backend with a backward, on one batch, before timing (each system takes this one step,
    on tables of its own; the gradient is of the rows before it); past FORWARD_TOLERANCE of the
    largest: an error."""
    checked = [r for r in runners if r.fwd_bwd is not None]
    grads = {r.name: r.fwd_bwd(batch).float() for r in checked}
    expected = grads[ref]
    limit = FORWARD_TOLERANCE[dtype] * float(expected.abs().max())
    diffs = {name: float((g - expected).abs().max()) for name, g in grads.items()}
    for name, d in diffs.items():
        if d > limit:
            raise RuntimeError(f"{name} ({dtype}): the per-id weights' gradient differs from {ref}'s by {d:.3g} "
                               f"(allowed {limit:.3g}): not the same work")
    print(f"weight gradient check ({dtype}): max |grad - {ref}| " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    return diffs


def workload_fields(args, ids_per_batch: float, dtype: str) -> dict:
    return dict(tables=args.tables, rows=args.rows, dim=args.dim, batch=args.batch,
                pooling_factor=args.pooling_factor, skew=args.skew, ids_per_batch=ids_per_batch,
                dtype=dtype, optimizer="rowwise_adagrad", iters=args.iters, weighted=args.weighted,
                learnable_weights=args.learnable_weights)


def run_cpu(args, dtype: str, machine: dict) -> List[dict]:
    batches = make_batches(args, BATCHES)
    n_ids = statistics.mean(b.values.numel() for b in batches)
    print(f"workload: {args.tables} tables x {args.rows} rows x D={args.dim} {dtype}, batch {args.batch}, "
          f"~{n_ids:.0f} ids/batch (bag length uniform 1..{2 * args.pooling_factor - 1}), "
          f"{f'Zipf({args.skew:g}) ids' if args.skew else 'uniform ids'}, "
          f"{'learnable per-id weights, ' if args.learnable_weights else 'per-id weights, ' if args.weighted else ''}"
          f"rowwise adagrad; median of {args.iters} iters after {args.warmup} warm-up")
    neo, weights = neo_runners(args, dtype=dtype, tunings=tuple(args.neo_tuning))
    (probes, latency_ns), systems, notes = probe_runners(args, dtype, batches), list(neo), {}
    row_bytes = args.dim * (2 if dtype == "fp16" else 4)
    if latency_ns:
        print(f"memory latency: {latency_ns:.0f} ns a dependent read; lines in flight = lookups/s x "
              f"{-(-row_bytes // 64)} lines a row x latency (Little's law)")
    fb = None if args.no_fbgemm else fbgemm_runner(args, weights, notes, dtype)
    if fb is not None:
        systems.append(fb)
    if not args.no_torch and dtype == "fp32":
        systems.append(torch_runner(args, weights))
    elif not args.no_torch:
        notes["torch"] = (f"left out of the {dtype} table: the baseline is fp32 only (nn.EmbeddingBag with "
                          f"torch.optim.Adagrad; module doc)")
    for backend, note in notes.items():
        print(f"note: {backend} {note}")
    diffs = forward_diffs(systems, batches[0], dtype)
    grad_diffs = weight_grad_diffs(systems, batches[0], dtype) if args.learnable_weights else {}
    records = [dict(backend=backend, dtype=dtype, phase=None, ms=None, note=note, device="cpu", machine=machine)
               for backend, note in notes.items()]       # a peer left out says so in the JSON too
    n_notes = len(records)
    peer = next((r for r in systems if r.name in ("fbgemm", "torch")), None)   # for the same-state pass
    if peer is None:
        print("note: no peer (FBGEMM, PyTorch) to run between Neo's forward and the probe: no same-state fraction")
    for threads in args.threads:
        torch.set_num_threads(threads)
        limit = alone = same = best = settings_ms = None   # best: the probe's fastest setting (none: no probe)
        for phase in ("fwd", "fwd_bwd"):
            runners = systems
            if phase == "fwd" and probes:   # its best setting joins the rotation (the probe has a forward only)
                best, settings_ms = choose_probe(probes, peer or systems[0], batches, args)
                runners = [next(p for p in probes if p.name == best)] + systems
            res = time_phase(runners, phase, batches, args.warmup, args.iters)
            if phase == "fwd" and probes:   # the machine's limit
                alone_ms, same = probe_readings(runners, best, peer, batches, args)
                limit, alone = n_ids / (res[best] / 1e3), n_ids / (alone_ms / 1e3)
                res = {"probe": res.pop(best), **res}
            for name, ms in res.items():
                lps = n_ids / (ms / 1e3)
                fwd = phase == "fwd"
                records.append(dict(backend=name, threads=threads, phase=phase, ms=ms, lookups_per_s=lps,
                                    probe_lookups_per_s=limit,
                                    fraction_of_probe=lps / limit if limit and fwd else None,
                                    probe_alone_lookups_per_s=alone if fwd else None,
                                    fraction_of_probe_alone=lps / alone if alone and fwd else None,
                                    **same_state_fields(same.get(name) if same and fwd else None, name, best, n_ids),
                                    probe_prefetch=best.split("@")[1] if probes and name == "probe" else None,
                                    probe_settings_ms=settings_ms if name == "probe" else None,
                                    latency_ns=latency_ns if fwd else None,
                                    lines_in_flight=(lps * -(-row_bytes // 64) * latency_ns * 1e-9
                                                     if latency_ns and fwd else None),
                                    row_bytes=row_bytes, gb_per_s=lps * row_bytes / 1e9,
                                    max_abs_diff_vs_neo=diffs.get(name),
                                    max_abs_weight_grad_diff_vs_neo=grad_diffs.get(name),
                                    device="cpu", **workload_fields(args, n_ids, dtype), machine=machine))
    print_table(records[n_notes:])
    return records


def print_table(records: List[dict]) -> None:
    w = max([11] + [len(r["backend"]) for r in records])   # --neo-tuning's runners have long names
    print(f"\n{'backend':<{w}} {'dtype':<5} {'threads':>7} {'phase':<8} {'ms':>10} {'Mlookups/s':>11} {'GB/s':>6} "
          f"{'of probe':>9} {'of alone':>9} {'same st.':>9} {'in flight':>9}")
    for r in records:
        frac = " ".join(f"{100 * r[k]:8.0f}%" if r.get(k) else f"{'-':>9}"
                       for k in ("fraction_of_probe", "fraction_of_probe_alone", "fraction_of_probe_same_state"))
        flight = f"{r['lines_in_flight']:>9.1f}" if r.get("lines_in_flight") else f"{'-':>9}"
        print(f"{r['backend']:<{w}} {r['dtype']:<5} {r['threads']:>7} {r['phase']:<8} {r['ms']:>10.2f} "
              f"{r['lookups_per_s'] / 1e6:>11.2f} {r['gb_per_s']:>6.1f} {frac} {flight}")
    by = {(r["backend"], r["dtype"], r["threads"], r["phase"]): r["ms"] for r in records}
    keys = sorted({(r["dtype"], r["threads"]) for r in records})
    tuned = sorted({r["backend"] for r in records if r["backend"].startswith("neo@")})
    print("\nspeed-up of neo (validate on) = other ms / neo ms   [neo-noval in brackets]")
    for other in ("fbgemm", "torch", *tuned):
        for dtype, t in keys:
            for phase in ("fwd", "fwd_bwd"):
                if (other, dtype, t, phase) in by and ("neo", dtype, t, phase) in by:
                    o = by[(other, dtype, t, phase)]
                    print(f"  neo/{other:<7} {dtype} threads={t} {phase:<8} {o / by[('neo', dtype, t, phase)]:6.2f}x"
                          f"   [{o / by[('neo-noval', dtype, t, phase)]:.2f}x]")


# ----------------------------------------------------------------------------- CUDA
def gpu_info(device: str) -> dict:
    """The GPU a CUDA record was measured on (name, memory, multiprocessors) and the library versions."""
    import triton

    if device != "cuda":            # the CUDA section run on CPU tensors (Triton's interpreter, in tests)
        return {"gpu": None, "torch": torch.__version__, "triton": triton.__version__}
    p = torch.cuda.get_device_properties(0)
    return {"gpu": p.name, "gpu_memory_gib": round(p.total_memory / 2 ** 30, 1), "gpu_sms": p.multi_processor_count,
            "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__}


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device-to-device copy of ``nbytes`` (read + write counted): the device's
    practical memory bandwidth, the yardstick of the lookups."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(buf)
    for _ in range(3):
        dst.copy_(buf)
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(buf)
    sync()
    return 2 * nbytes * 10 / (time.perf_counter() - t0)


def run_cuda(args, machine: dict, device: str = "cuda") -> List[dict]:
    """The ``triton`` backend against plain PyTorch (fp32) on the GPU, every ``--dtypes``; the
    forward outputs compared before timing; bandwidth as a share of a device-to-device copy.
    ``device="cpu"`` runs the same section on CPU tensors (Triton's interpreter: a test of
    this code, not a measurement)."""
    gpu = gpu_info(device)
    print(f"\n== CUDA: triton backend vs PyTorch on {gpu['gpu'] or device}")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    copy_bw = copy_bandwidth(device, (1 << 30) if device == "cuda" else (1 << 24))
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)")
    batches = make_batches(args, 4, device=device)
    n_ids = statistics.mean(b.values.numel() for b in batches)
    records = []
    for dtype in args.dtypes:
        row_bytes = args.dim * (2 if dtype == "fp16" else 4)
        moved = {  # bytes: forward reads the rows; the update reads + writes weights and the row-wise state
            "fwd": n_ids * row_bytes,
            "fwd_bwd": n_ids * row_bytes + 2 * n_ids * (row_bytes + 4),
        }
        runners, weights = neo_runners(args, names=("triton",), backend="triton", device=device, dtype=dtype)
        if not args.no_torch and dtype == "fp32":
            runners.append(torch_runner(args, weights, device=device))
        print(f"workload: {args.tables} tables x {args.rows} rows x D={args.dim} {dtype}, batch {args.batch}, "
              f"~{n_ids:.0f} ids/batch")
        diffs = forward_diffs(runners, batches[0], dtype, ref="triton")
        for phase in ("fwd", "fwd_bwd"):
            res = time_phase(runners, phase, batches, args.warmup, args.iters, sync=sync)
            for name, ms in res.items():
                bw = moved[phase] / (ms / 1e3)
                records.append(dict(backend=name, threads=0, phase=phase, ms=ms, lookups_per_s=n_ids / (ms / 1e3),
                                    bandwidth_gbs=bw / 1e9, bandwidth_share_of_copy=bw / copy_bw,
                                    copy_gbs=copy_bw / 1e9, max_abs_diff_vs_triton=diffs[name], device=device,
                                    **workload_fields(args, n_ids, dtype), **gpu, machine=machine))
                print(f"{name:<8} {dtype} {phase:<8} {ms:9.3f} ms  {n_ids / ms / 1e6:7.2f} G lookups/s  "
                      f"{bw / 1e9:8.1f} GB/s  {100 * bw / copy_bw:5.1f}% of copy")
            if "torch" in res:
                print(f"  triton/torch {dtype} {phase}: {res['torch'] / res['triton']:.2f}x")
        del runners, weights
    return records


DTYPES = ("fp32", "fp16")   # weight dtypes run (bf16 is not: FBGEMM's CPU TBE would run it in fp32)
DEFAULTS = {"tables": 8, "rows": 1_000_000, "batch": 4096, "iters": 10, "warmup": 2}
QUICK = {"tables": 4, "rows": 20_000, "batch": 256, "iters": 3, "warmup": 1}


def tuning_settings(s: str) -> Dict[str, int]:
    """--neo-tuning: ``name=value`` pairs, comma-separated, names those of ``neo._C._tuning()``
    (csrc/kernel_types.h ``Tuning``), values >= 0."""
    from neo import _C

    fields = _C._tuning()
    out: Dict[str, int] = {}
    for item in s.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or name not in fields or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not name=value with a name from "
                                             f"{', '.join(fields)} and a value >= 0")
        out[name] = int(value)
    return out


def dtype_list(s: str) -> List[str]:
    """--dtypes: a comma-separated list of DTYPES."""
    out = [x.strip() for x in s.split(",")]
    bad = [x for x in out if x not in DTYPES]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"unsupported dtype(s) {', '.join(map(repr, bad)) or repr(s)}: "
                                         f"choose from {', '.join(DTYPES)}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    # --tables/--rows/--batch/--iters/--warmup default to None: filled in after parsing from
    # DEFAULTS, or with --quick from QUICK, but only where the flag was not given (--quick never
    # overrides an explicit flag).
    p.add_argument("--tables", type=positive_int, default=None, help=f"default {DEFAULTS['tables']}")
    p.add_argument("--rows", type=positive_int, default=None, help=f"default {DEFAULTS['rows']}")
    p.add_argument("--dim", type=multiple_of(4), default=64, help="embedding dim (a positive multiple of 4)")
    p.add_argument("--batch", type=positive_int, default=None, help=f"default {DEFAULTS['batch']}")
    p.add_argument("--pooling-factor", type=positive_int, default=20, help="mean bag length (lengths uniform in 1..2L-1)")
    p.add_argument("--skew", type=nonneg_float, default=0.0,
                   help="Zipf exponent of the ids (0: uniform, the default; e.g. 1.05: a few hot rows, scattered "
                        "over each table)")
    p.add_argument("--iters", type=positive_int, default=None, help=f"default {DEFAULTS['iters']}")
    p.add_argument("--warmup", type=nonneg_int, default=None, help=f"default {DEFAULTS['warmup']}")
    p.add_argument("--threads", type=positive_int_list, default=[1, 2], help="comma-separated thread counts, e.g. 1,2")
    p.add_argument("--dtypes", type=dtype_list, default=["fp32", "fp16"],
                   help=f"comma-separated weight dtypes, from {', '.join(DTYPES)}")
    p.add_argument("--quick", action="store_true",
                   help="small workload for a smoke test: " + ", ".join(f"--{k} {v}" for k, v in QUICK.items())
                        + " (flags given explicitly are kept)")
    p.add_argument("--weighted", action="store_true", help="per-id weights in every batch (module doc)")
    p.add_argument("--learnable-weights", action="store_true",
                   help="per-id weights that require grad: each system also computes their gradient (module doc)")
    p.add_argument("--no-fbgemm", action="store_true")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--neo-tuning", type=tuning_settings, action="append", default=[], metavar="NAME=K[,NAME=K]",
                   help="CPU: also time Neo under these kernel settings (neo._C._set_tuning; repeatable), e.g. "
                        "bwd_lookahead=16,sort_prefetch=1: a runner 'neo@...' beside Neo at this CPU's defaults")
    p.add_argument("--cuda-only", action="store_true",
                   help="only the CUDA section (the triton backend against PyTorch on the GPU); an error without CUDA")
    add_isa_arg(p)
    p.add_argument("--json", metavar="FILE", type=json_path, help="write the records (a JSON list) to FILE")
    args = p.parse_args(argv)
    args.weighted = args.weighted or args.learnable_weights
    apply_quick(args, DEFAULTS, QUICK)
    if args.cuda_only and not torch.cuda.is_available():
        p.error("--cuda-only: this torch sees no CUDA device")
    apply_isa(args.isa)
    start_rank(torch.get_num_threads(), system_malloc=False)
    machine = machine_info(args.isa)
    print(describe_machine(machine))
    records = []
    for dtype in ([] if args.cuda_only else args.dtypes):
        records += run_cpu(args, dtype, machine)
    if torch.cuda.is_available():
        records += run_cuda(args, machine)
    if args.json:
        write_json(args.json, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
