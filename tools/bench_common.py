"""Helpers shared by the benchmark scripts in tools/ (run as scripts: tools/ is on sys.path)."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

import neo  # noqa: F401 - requests huge pages for torch's large buffers before any (neo.host_memory)

# --isa: the instruction set every system in a benchmark may use, through each library's own
# switch, so that an AVX-512 machine can stand in for an AVX2 one for Neo and its peers alike.
#   Neo      NEO_CPU_ISA                  (csrc/cpu_isa.h)
#   PyTorch  ATEN_CPU_CAPABILITY          (ATen's vectorized CPU kernels)
#   oneDNN   ONEDNN_MAX_CPU_ISA           (torch's mkldnn ops)
#   MKL      MKL_ENABLE_INSTRUCTIONS      (torch's fp32 matrix products)
#   FBGEMM   FBGEMM_ENABLE_INSTRUCTIONS   (fbgemm::fbgemmInstructionSet(): its JIT embedding kernels
#                                          (EmbeddingSpMDM, TorchRec's and FBGEMM's TBE forward) and GEMMs)
# Every variable is read when its library first dispatches, so the benchmark re-executes
# itself with them set before anything is imported (apply_isa).
ISA_CHOICES = ("native", "avx512", "avx2", "baseline")
_ISA_ENV = {
    "avx512": {"NEO_CPU_ISA": "avx512", "ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx2": {"NEO_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"},
    "baseline": {"NEO_CPU_ISA": "baseline", "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},   # FBGEMM has no cap below AVX2
}
_ALL_ISA_VARS = sorted({k for env in _ISA_ENV.values() for k in env})


def peer_version(*modules: str) -> Optional[str]:
    """The version of an optional peer (TorchRec, FBGEMM) if every one of `modules` imports:
    the first module's ``__version__`` ("unknown" without one). None where one does not import
    (not installed, or installed without its native parts)."""
    import importlib

    try:
        first = [importlib.import_module(m) for m in modules][0]
    except Exception:  # noqa: BLE001 - any import failure means: no such peer here
        return None
    return getattr(first, "__version__", "unknown")


def quiet_peer_logs() -> None:
    """Silence TorchRec's planner warnings and torch.fx notices (they would bury the result tables)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("torchrec", "torch.fx", "torch.fx._symbolic_trace"):
        logging.getLogger(name).setLevel(logging.ERROR)


def add_system_malloc_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc malloc at its defaults (by default every rank calls "
                             "neo.host_memory.retain_freed_memory(), as `neo train` does; it applies to both systems)")


def add_no_shm_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-shm", action="store_true",
                        help="Neo's embedding AlltoAlls through gloo, like its peers' (by default through shared "
                             "memory between the ranks of one host, as `neo train` does; see neo/distributed/shm.py)")


def start_rank(threads: int, system_malloc: bool) -> None:
    """Per benchmark rank, before any work: torch threads, the host-memory policy (process-wide:
    Neo and its peers alike), and quiet peer logs."""
    import torch

    torch.set_num_threads(threads)
    if not system_malloc:
        from neo.host_memory import retain_freed_memory
        retain_freed_memory()
    quiet_peer_logs()


def balanced_orders(n: int) -> List[List[int]]:
    """Orders of ``n`` systems in which each one runs right after each other one equally often:
    the rows of a Williams Latin square (``n`` rows for even ``n``, ``2 n`` for odd ``n``, each
    system once per row). A benchmark that runs its systems in ``orders[i % len(orders)]`` at
    iteration i gives every system the same mix of predecessors, so that one that leaves the
    caches (or the TLB) cold or warm for the next does not favour one system. A plain rotation
    does not do this: it keeps every system right after the same one. Run one after another,
    the rows also hand over from one to the next: ``call_orders`` rotates the rows where that
    would put a system right after itself."""
    if n < 1:
        return []
    first, lo, hi = [0], 1, n - 1           # 0, 1, n - 1, 2, n - 2, ...
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % n for x in first] for i in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def call_orders(n: int) -> List[List[int]]:
    """``balanced_orders(n)`` as a benchmark runs them one after another, each row rotated by one
    place where it would start with the system the row before it ended with: no system then runs
    right after itself, across the rows' boundaries (the cycle's too) included. Only 2 and 3 systems
    need it (their Williams rows hand over to the same system at 2 of 2 and 2 of 6 boundaries:
    a system right after itself finds its own data and code in the caches, which favoured the
    shorter kernel: Neo's D 128 interaction ran 13% faster after itself than after torch's path on
    the Zen 4 VM of 2026-12-05, docs/benchmarks.md); with them rotated every ordered pair of two
    systems follows each other equally often over the cycle. From 4 systems on the rows are
    unchanged."""
    rows: List[List[int]] = []
    for row in balanced_orders(n):
        if rows and row[0] == rows[-1][-1]:   # (one system: rotating its row changes nothing)
            row = row[1:] + row[:1]
        rows.append(row)
    return rows


def interleaved(n: int, warmup: int, iters: int) -> Iterator[Tuple[bool, int]]:
    """The calls of a benchmark that times ``n`` systems side by side: ``(timed, j)`` for each call
    of system ``j``. Each of ``warmup + iters`` iterations calls every system once, in the
    ``call_orders`` row of its index (the order depends on the index alone: ranks that call
    collectives stay in step); ``timed`` is False in the first ``warmup`` iterations."""
    orders = call_orders(n)
    for i in range(warmup + iters):
        for j in orders[i % len(orders)]:
            yield i >= warmup, j


def median_ci(values: Sequence[float], level: float = 0.95) -> Tuple[float, float]:
    """A distribution-free confidence interval of the median of ``values``: the order statistics
    x_(k) and x_(n + 1 - k) with k the largest rank for which a Binomial(n, 1/2) count falls
    below k with probability at most (1 - level) / 2 (the interval covers the true median with
    probability at least ``level`` when the values are independent draws of one distribution; no
    normality assumed). Fewer than 6 values cannot reach 95%: then the whole range."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_ci of no values")
    tail, k = 0.0, 0
    while k < n // 2:
        nxt = tail + math.comb(n, k) / 2.0 ** n     # P(count <= k)
        if nxt > (1.0 - level) / 2:
            break
        tail, k = nxt, k + 1
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


# argparse ``type=`` helpers: bad command-line input gives argparse's one-line error (exit status 2,
# naming the flag) before any benchmark work, rather than a traceback, a hang or a silent nonsense
# figure. The scalar ones are the neo commands' own (neo/commands/arg_types.py: importing it does
# not import torch, so --isa still takes effect).
from neo.commands.arg_types import non_negative_int as nonneg_int  # noqa: E402
from neo.commands.arg_types import output_problem, positive_float, positive_int  # noqa: E402,F401


def nonneg_float(s: str) -> float:
    """A finite number >= 0."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {s}")
    return v


def multiple_of(m: int):
    """A ``type=``: a positive integer that is a multiple of ``m`` (e.g. 4 for an embedding dim)."""
    def parse(s: str) -> int:
        v = positive_int(s)
        if v % m:
            raise argparse.ArgumentTypeError(f"must be a positive multiple of {m}, got {s!r}")
        return v
    parse.__name__ = f"multiple_of_{m}"
    return parse


def _int_list(s: str, each) -> List[int]:
    parts = [x.strip() for x in str(s).split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"must be a comma-separated list of integers, e.g. 1,2; got {s!r}")
    try:
        return [each(x) for x in parts]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (in {s!r})") from None


def positive_int_list(s: str, multiple: int = 1) -> List[int]:
    """A comma-separated list of integers >= 1 (e.g. "1,2" for --threads), each a multiple of ``multiple``."""
    return _int_list(s, multiple_of(multiple) if multiple > 1 else positive_int)


def nonneg_int_list(s: str) -> List[int]:
    """A comma-separated list of integers >= 0 (e.g. bench_eval.py's --sizes, where 0 means the default)."""
    return _int_list(s, nonneg_int)


def multiple_of_list(m: int):
    """A ``type=``: a comma-separated list of positive multiples of ``m``."""
    def parse(s: str) -> List[int]:
        return positive_int_list(s, multiple=m)
    parse.__name__ = f"multiple_of_{m}_list"
    return parse


def json_path(s: str) -> str:
    """An output file path that can be written (its folder exists, or can be made as write_json
    makes it, and takes a new file; not a folder), checked at parse time so that a bad path fails
    at once, not after the whole benchmark."""
    problem = output_problem(s, make_dirs=True) if s else "an empty path"
    if problem:
        raise argparse.ArgumentTypeError(f"cannot write {s!r}: {problem}")
    return s


def apply_quick(args: argparse.Namespace, defaults: Dict[str, Any], quick: Dict[str, Any]) -> None:
    """Fill in the flags parsed as None (not given on the command line): from ``quick`` under
    --quick, else from ``defaults``. --quick never overrides a flag given explicitly."""
    for k, v in (quick if args.quick else defaults).items():
        if getattr(args, k) is None:
            setattr(args, k, v)


def add_timing_args(parser: argparse.ArgumentParser, iters: int = 10, warmup: int = 2) -> None:
    """The flags of a one-process benchmark's timed loop: --threads (a list), --iters, --warmup,
    --json and --isa."""
    parser.add_argument("--threads", type=positive_int_list, default=[1], help="comma-separated thread counts, e.g. 1,2")
    parser.add_argument("--iters", type=positive_int, default=iters)
    parser.add_argument("--warmup", type=nonneg_int, default=warmup)
    parser.add_argument("--json", default=None, type=json_path)
    add_isa_arg(parser)


def start_one_process(args: argparse.Namespace) -> Dict[str, Any]:
    """A one-process benchmark's start, after parsing: the --isa cap applied (before torch is
    imported), freed memory kept (as training does), the machine described and printed; returns
    its record (``machine_info``)."""
    apply_isa(args.isa)
    from neo.host_memory import retain_freed_memory

    retain_freed_memory()
    machine = machine_info(args.isa)
    print(describe_machine(machine))
    return machine


@dataclass
class Timed:
    """One system's timed calls: wall seconds, and CPU seconds of this process (the calling
    thread and any threads it works through, e.g. gloo's)."""
    wall: List[float] = field(default_factory=list)
    cpu: List[float] = field(default_factory=list)


def time_interleaved(systems: Dict[Hashable, Callable[[], Any]], warmup: int, iters: int,
                     before: Callable[[], Any] = lambda: None) -> Dict[Hashable, Timed]:
    """Each ``systems[key]()`` timed over ``iters`` rounds after ``warmup`` untimed ones, the
    systems interleaved (``interleaved``: each right after each other one equally often, in an
    order set by the round's index alone, so that ranks calling collectives stay in step, and so
    that load from other jobs hits them alike). ``before()`` runs, untimed, before every call (a
    barrier, a device synchronisation)."""
    import time

    keys = list(systems)
    times: Dict[Hashable, Timed] = {k: Timed() for k in keys}
    for timed, j in interleaved(len(keys), warmup, iters):
        key = keys[j]
        before()
        t0, c0 = time.perf_counter(), time.process_time()
        systems[key]()
        t1, c1 = time.perf_counter(), time.process_time()
        if timed:
            times[key].wall.append(t1 - t0)
            times[key].cpu.append(c1 - c0)
    return times


def write_json(path: str, payload: Any) -> None:
    """Write the benchmark's records (creating the folder) and say where."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    if isinstance(payload, dict) and "records" not in payload:
        print(f"wrote {path}")
        return
    n = len(payload) if isinstance(payload, list) else len(payload["records"])
    print(f"wrote {n} records to {path}")


def add_sharded_workload_args(p: argparse.ArgumentParser, world_sizes: List[int], types: Sequence[str],
                              batch_default: int) -> None:
    """The workload flags the sharded benchmarks share (bench_sharded, bench_sequence_sharded):
    world sizes, sharding types, the tables' count, rows and dim, samples per rank, column-shard
    width, timed and warm-up steps, torch threads. rows, batch, steps and warmup default to None:
    filled in by ``apply_quick`` (``--quick`` only where not given)."""
    p.add_argument("--world-sizes", type=positive_int, nargs="+", default=list(world_sizes))
    p.add_argument("--types", nargs="+", default=list(types), choices=types)
    p.add_argument("--tables", type=positive_int, default=8)
    p.add_argument("--rows", type=positive_int, default=None, help="default 100_000")
    p.add_argument("--dim", type=multiple_of(4), default=64, help="embedding dim (a positive multiple of 4)")
    p.add_argument("--batch", type=positive_int, default=None, help=f"samples per rank (default {batch_default})")
    p.add_argument("--cw-dim", type=multiple_of(4), default=32, help="columns per column shard (both systems)")
    p.add_argument("--steps", type=positive_int, default=None, help="default 10")
    p.add_argument("--warmup", type=nonneg_int, default=None, help="default 3")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per process")


def add_isa_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--isa", choices=ISA_CHOICES, default="native",
                        help="cap the CPU instruction set of every system and process: Neo (NEO_CPU_ISA), PyTorch "
                             "(ATEN_CPU_CAPABILITY), oneDNN, MKL and FBGEMM (see tools/bench_common.py); e.g. avx2 "
                             "on an AVX-512 machine to stand in for an AVX2 one. native: each library's own choice")


def isa_env(isa: str) -> Dict[str, str]:
    """The environment variables that cap every library at ``isa`` ({} for native)."""
    return dict(_ISA_ENV.get(isa, {}))


def apply_isa(isa: str) -> None:
    """Make this process and every process it starts run under ``isa``: if the environment is
    not already set so, re-execute the script with it (before torch or neo._C dispatched)."""
    want = isa_env(isa)
    current = {k: os.environ.get(k) for k in _ALL_ISA_VARS}
    if all(current[k] == want.get(k) for k in _ALL_ISA_VARS):
        return
    env = {k: v for k, v in os.environ.items() if k not in _ALL_ISA_VARS}
    env.update(want)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def machine_info(isa: str = "native") -> Dict[str, Any]:
    """What a figure was measured on, for every benchmark record: the CPU model and its ISA
    flags (with family / model / stepping and cache sizes: one model name may cover several
    generations on a shared VM), the --isa cap and the variables that apply it, what Neo's kernels and ATen chose,
    library versions, and the date."""
    import torch

    from neo.cpp import cpu_isa_info
    from neo.host_memory import THP_ENV, transparent_hugepage_mode

    info = cpu_isa_info()
    try:
        import fbgemm_gpu  # noqa: F401
        from importlib.metadata import version

        fbgemm = version("fbgemm-gpu-cpu")
    except Exception:  # noqa: BLE001 - not installed
        fbgemm = None
    return {
        "cpu_model": info["cpu_model"], "cpu_id": info["cpu_id"], "cpu_caches": info["cpu_caches"],
        "cpu_flags": info["cpu_flags"], "cpus": os.cpu_count(),
        "isa_cap": isa, "isa_env": {k: os.environ[k] for k in _ALL_ISA_VARS if k in os.environ},
        "neo_cpu_isa": info["neo_cpu_isa"], "neo_interaction_tiles": info["interaction_tiles"],
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__, "fbgemm_gpu": fbgemm,
        "transparent_hugepage": transparent_hugepage_mode(), "torch_thp_alloc": os.environ.get(THP_ENV),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": round(os.getloadavg()[0], 2),
    }


def memory_latency_ns() -> float:
    """Nanoseconds a dependent read takes from DRAM now (bench_gather_probe.memory_latency_ns: a
    pointer chase over a table of at least 1 GiB and twice the last-level cache, after a write pass
    over twice that cache; about a second). A shared VM's memory moves between phases (the
    same runs of 2026-12-06 saw 109 ns and 189-309 ns), which shifts every memory-bound figure;
    the end-to-end benchmarks record it before and after their runs so that a phase is not read as
    a regression."""
    from bench_gather_probe import evictor, flush_mib_default, make_table
    from bench_gather_probe import memory_latency_ns as chase

    from neo.cpp import cpu_isa_info

    flush_mib = flush_mib_default(cpu_isa_info()["cpu_caches"])
    table = make_table(max(1.0, flush_mib / 1024))
    return chase(table, evictor(flush_mib))


def note_memory_latency(records: List[Dict[str, Any]], before: float, after: float) -> None:
    """Prints the memory latency around a benchmark's runs and adds it to every record's
    ``machine`` as ``memory_latency_ns``: ``{"before": ns, "after": ns}``."""
    print(f"memory latency: {before:.0f} ns a dependent read before the runs, {after:.0f} ns after")
    for r in records:
        if isinstance(r.get("machine"), dict):
            r["machine"]["memory_latency_ns"] = {"before": round(before, 1), "after": round(after, 1)}


def describe_machine(m: Dict[str, Any]) -> str:
    """One line for the console: CPU, flags, the ISA cap and what the kernels chose."""
    flags = " ".join(f for f in m["cpu_flags"] if f.startswith(("avx", "amx", "fma", "f16c", "asimd", "sve")))
    ident = ", ".join(x for x in (m.get("cpu_id"), " ".join(f"{k} {v}" for k, v in (m.get("cpu_caches") or {}).items()
                                                              if k in ("L2", "L3"))) if x)
    return (f"machine: {m['cpu_model']}{f' [{ident}]' if ident else ''} ({m['cpus']} CPUs; {flags}); --isa {m['isa_cap']}: Neo kernels "
            f"{m['neo_cpu_isa']}, ATen {m['aten_cpu_capability']}; huge pages: THP {m['transparent_hugepage']}, "
            f"torch allocations {'advised' if m['torch_thp_alloc'] == '1' else 'not advised'}; "
            f"load average {m['load_average']}; {m['date']}")


def run_world_sizes(rank_main, args, world_sizes) -> List[Dict[str, Any]]:
    """``rank_main(rank, W, args)`` in one gloo group per world size (tests/multiprocess.py, one
    torch thread a rank unless ``args.threads``); rank 0's records of every size, with the time
    each took and the machine printed."""
    import time

    from tests.multiprocess import run_multiprocess

    records: List[Dict[str, Any]] = []
    for W in world_sizes:
        t0 = time.time()
        out = run_multiprocess(rank_main, W, args, timeout_s=3600, collective_timeout_s=600, threads=args.threads,
                               env={"OMP_NUM_THREADS": str(args.threads)})
        records.extend(out[0])
        print(f"[world size {W}: {time.time() - t0:.0f} s]")
    machines = [r["machine"] for r in records if "machine" in r]
    if machines:
        print(describe_machine(machines[0]))
    return records


def torchrec_local_blocks(t) -> List[tuple]:
    """``(row offset, column offset, tensor)`` of each block of a TorchRec parameter this rank
    holds: the local shards of a ``ShardedTensor``, or the whole tensor of a replica."""
    if hasattr(t, "local_shards"):
        return [(*sh.metadata.shard_offsets, sh.tensor) for sh in t.local_shards()]
    return [(0, 0, t)]


def torchrec_table_blocks(model, weights: Dict[str, Any]):
    """``(TorchRec's local block, the same block of Neo's full table)`` for every table of a
    sharded TorchRec ``model``; ``weights``: Neo's full tables by name (``full_weights()``)."""
    for key, w in model.state_dict().items():
        if key.endswith(".weight"):
            full = weights[key.split(".")[-2]]
            for r, c, blk in torchrec_local_blocks(w):
                yield blk, full[r:r + blk.shape[0], c:c + blk.shape[1]]


def copy_into_torchrec(model, weights: Dict[str, Any]) -> None:
    """Neo's full tables into TorchRec's local shards (or a replica's whole table), so that both
    systems start from the same tables and do the same work."""
    import torch

    with torch.no_grad():
        for blk, mine in torchrec_table_blocks(model, weights):
            blk.copy_(mine)


def shard_torchrec(module, sharder_cls, sharding_type: str, min_partition: int, pg, weights: Dict[str, Any]):
    """TorchRec's ``DistributedModelParallel`` over ``module`` (an unsharded ``EmbeddingCollection``
    or ``EmbeddingBagCollection``, built on the meta device), on CPU, started from Neo's tables.

    Every table of ``module`` is forced to ``sharding_type`` by ``ParameterConstraints``
    (column_wise: shards of ``min_partition`` columns); ``sharder_cls`` (the module's sharder class:
    ``EmbeddingCollectionSharder``, ``EmbeddingBagCollectionSharder``) is built with fused
    ``EXACT_SGD`` at lr 0.01; the plan is ``EmbeddingShardingPlanner``'s collective plan over Neo's
    ``ProcessGroups`` ``pg`` (one host of ``pg.world_size`` CPU ranks), and the sharded model holds
    ``weights`` (Neo's full tables by name, :func:`copy_into_torchrec`). Collective: every rank
    calls it alike."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv

    W = pg.world_size
    names = [key.split(".")[-2] for key in module.state_dict() if key.endswith(".weight")]
    constraints = {name: ParameterConstraints(sharding_types=[sharding_type],
                                              min_partition=min_partition if sharding_type == "column_wise" else None)
                   for name in names}
    sharder = sharder_cls(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.01})
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=W, compute_device="cpu", local_world_size=W),
                                       constraints=constraints)
    plan = planner.collective_plan(module, [sharder], pg.world)
    model = DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg.world), plan=plan,
                                     sharders=[sharder], device=torch.device("cpu"))
    copy_into_torchrec(model, weights)
    return model
