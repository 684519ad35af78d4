"""``state_sha256``: one digest of every parameter and optimizer state of a job.

Two runs with the same plan end with the same digest exactly when their embedding tables,
sparse optimizer states and counters, dense parameters and dense optimizer states are equal
bit for bit (the trainer's final JSON line carries it, so a user, or a test, compares runs
by one string). Canonical order: every piece is hashed on its own into ``key=sha256`` lines
(embedding pieces keyed by table, state name and global offsets, every column band's per-row
state included; data-parallel replicas once), the lines are gathered
from every rank, sorted, and hashed together.
"""

from __future__ import annotations

import hashlib
from typing import List

import torch
import torch.distributed as dist

from neo.planner.types import ShardingType

__all__ = ["state_sha256", "replica_sha256", "tensor_sha256"]


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's values (dtype and shape included), whatever its strides or device."""
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}:{tuple(t.shape)}:".encode())
    if t.numel():
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def _hash_lines(lines: List[str]) -> str:
    """One sha256 over ``key=sha256`` lines in sorted order (the order pieces were listed in, or
    gathered from ranks in, does not matter)."""
    h = hashlib.sha256()
    for line in sorted(lines):
        h.update(line.encode() + b"\n")
    return h.hexdigest()


def _embedding_lines(sharded) -> List[str]:
    lines: List[str] = []
    lookup, rank = sharded.lookup, sharded.pg.rank
    if lookup is None:
        return lines
    for t in sharded.tables:
        tp = sharded.plan.tables[t.name]
        for k, s in enumerate(tp.shards):
            if s.rank != rank or not (s.rows and s.cols):
                continue
            if tp.sharding_type is ShardingType.DATA_PARALLEL and rank != 0:
                continue                                         # replicas are equal: rank 0's stands for all
            local = f"{t.name}#{k}"
            where = f"{s.row_offset},{s.col_offset},{s.rows},{s.cols}"
            lines.append(f"embedding/{t.name}/weight/{where}={tensor_sha256(lookup.table_weight(local))}")
            for name, v in lookup.table_optimizer_state(local).items():
                lines.append(f"embedding/{t.name}/{name}/{where}={tensor_sha256(v)}")
    if rank == 0:
        for name, steps in sorted(lookup.optimizer_steps().items()):
            lines.append(f"embedding/{name}/optimizer_step={steps}")
    return lines


def _dense_lines(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> List[str]:
    from neo.train.checkpoint.dcp_state import dense_tensors

    lines = [f"dense/{k}={tensor_sha256(v)}" for k, v in dense_tensors(model).items()]
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, v in sorted(optimizer.state.get(p, {}).items()):
                value = tensor_sha256(v) if isinstance(v, torch.Tensor) else repr(v)
                lines.append(f"dense_optimizer/{names.get(id(p), '?')}/{key}={value}")
    return lines


def replica_sha256(embedding, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """The digest of one worker's whole replica (an unsharded ``TableBatchedEmbedding``, the dense
    model and its optimizer): wave-synchronous training (neo/async_train), where every worker
    holds every table. Lines keyed by table and state name over whole tables: comparable between
    such runs (a resumed one against an uninterrupted one), not with a sharded job's digest."""
    lines = []
    for t in embedding.tables:
        lines.append(f"embedding/{t.name}/weight={tensor_sha256(embedding.table_weight(t.name))}")
        for name, v in embedding.table_optimizer_state(t.name).items():
            lines.append(f"embedding/{t.name}/{name}={tensor_sha256(v)}")
    for name, steps in sorted(embedding.optimizer_steps().items()):
        lines.append(f"embedding/{name}/optimizer_step={steps}")
    lines += _dense_lines(model, optimizer)
    return _hash_lines(lines)


@torch.no_grad()
def state_sha256(sharded, model: torch.nn.Module, optimizer: torch.optim.Optimizer, pg) -> str:
    """The job's state digest (hex); collective over ``pg.world``: every rank gets the same string."""
    lines = _embedding_lines(sharded)
    if pg.rank == 0:
        lines += _dense_lines(model, optimizer)                  # DDP keeps the dense replicas equal
    if pg.world_size > 1:
        everyone: List[List[str]] = [None] * pg.world_size      # type: ignore[list-item]
        dist.all_gather_object(everyone, lines, group=pg.world)
        lines = [x for part in everyone for x in part]
    return _hash_lines(lines)
