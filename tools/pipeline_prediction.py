"""The model side of tools/bench_pipeline.py: a pipeline step predicted from the chunk profiles,
the layers' bytes and the measured point-to-point times, and the runtime's cost per schedule
action recovered from the null model's run (``fit_op_ms`` with a core per rank, ``runtime_cpu_ms``
with more ranks than cores). Pure functions of the benchmark's measurements (docs/pipeline.md,
"Measured against the model")."""

from __future__ import annotations

from typing import Dict, Tuple

from neo.pipeline.simulate import COST_FIELDS

__all__ = ["comm_ms", "predict_pipeline", "allreduce_gbps", "fit_op_ms", "costs_of_rows", "compute_ms", "runtime_cpu_ms"]


def comm_ms(one_way: Dict[int, float], nbytes: float) -> float:
    """One-way transfer of ``nbytes``, interpolated between the measured tiny and large messages
    (latency + bytes / bandwidth; on a loaded machine the latency is mostly waking the receiver)."""
    (small, t_small), (big, t_big) = sorted(one_way.items())
    return t_small + max(0.0, t_big - t_small) * (nbytes - small) / max(big - small, 1)


def predict_pipeline(chunk_rows, layer_rows, schedule: str, v: int, split, W: int, M: int, bandwidth: float, one_way,
             op_ms: float = 0.0, cores: int = 0, threads: int = 1, replayed: bool = True):
    """The model's step for ``split`` (chunk k on rank k mod W): the chunks' own times
    (``chunk_rows``, profile_chunks), the layers' bytes (``layer_rows``). ``replayed``: each
    schedule's order replayed (neo.pipeline.simulate), else the closed form (perf_model.predict)."""
    from neo.pipeline.perf_model import per_rank, predict
    from neo.pipeline.simulate import predict_replayed

    S, C = W, len(split)
    chunk_params = [sum(r["param_bytes"] for r in layer_rows[a:z + 1]) for a, z in split]
    boundary = [comm_ms(one_way, layer_rows[split[k][1]]["activation_bytes"]) for k in range(C - 1)]
    if replayed:
        return predict_replayed(schedule, costs_of_rows(chunk_rows), M, S, v, comm_ms=boundary, op_ms=op_ms, cores=cores,
                                threads_per_rank=threads, chunk_param_bytes=chunk_params, bandwidth_gbps=bandwidth)
    ranks = {key: per_rank([c[key] for c in chunk_rows], S) for key in COST_FIELDS}
    comm = boundary if v == 1 else [sum(boundary) / len(boundary)] * (S - 1)
    return predict(schedule, ranks["fwd_ms"], ranks["bwd_ms"], M, comm_ms=comm, virtual_stages=max(v, 2),
                   replicas=1, stage_wgrad_ms=ranks["weight_grad_ms"], stage_input_grad_ms=ranks["input_grad_ms"],
                   stage_param_bytes=per_rank(chunk_params, S), bandwidth_gbps=bandwidth, op_ms=op_ms, cores=cores,
                   threads_per_rank=threads)


def allreduce_gbps(probe) -> float:
    """The ring AllReduce bandwidth (perf_model.allreduce_ms) under which a probe's (bytes, ranks, ms) holds."""
    nbytes, n, ms = probe
    return 2 * (n - 1) / n * nbytes / (ms * 1e6)


def fit_op_ms(null_chunks, null_rows, schedule: str, v: int, split, W: int, M: int, bandwidth: float, one_way,
              null_ms: float, cores: int = 0, threads: int = 1) -> float:
    """The cost of one schedule action (``op_ms`` of :func:`neo.pipeline.perf_model.predict`) under
    which the model gives the null model's measured pipelined time ``null_ms`` (bisection: the
    prediction grows with it); 0 where the null model's own arithmetic already explains it."""
    def pipe(op: float) -> float:
        return predict_pipeline(null_chunks, null_rows, schedule, v, split, W, M, bandwidth, one_way, op, cores,
                        threads).pipeline_ms

    lo, hi = 0.0, max(null_ms, 1e-6)
    if pipe(lo) >= null_ms:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pipe(mid) < null_ms else (lo, mid)
    return (lo + hi) / 2


def costs_of_rows(rows):
    """The simulator's costs of chunk profile rows (dicts of ChunkProfile's fields)."""
    from neo.pipeline.profile import ChunkProfile
    from neo.pipeline.simulate import chunk_costs

    return chunk_costs([ChunkProfile(**r) for r in rows])


def compute_ms(chunks, schedule: str, v: int, W: int, M: int) -> Tuple[float, int]:
    """(The chunks' compute in one step of ``schedule``, its number of actions): every rank's
    actions (neo.pipeline.simulate.orders) at the chunk profile's costs, summed."""
    from neo.pipeline.simulate import orders

    costs = costs_of_rows(chunks)
    acts = [a for rank in orders(schedule, W, M, v) for a in rank]
    return sum(costs.of(a.kind, a.chunk) for a in acts), len(acts)


def runtime_cpu_ms(null_chunks, schedule: str, v: int, W: int, M: int, null_cpu_ms: float) -> float:
    """The runtime's CPU per schedule action: the null model's pipelined part's CPU (every rank's
    process time, summed) less its chunks' compute, over the actions of a step (0 at least)."""
    compute, actions = compute_ms(null_chunks, schedule, v, W, M)
    return max(0.0, (null_cpu_ms - compute) / actions)
