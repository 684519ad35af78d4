"""The earlier checkpoint format (``neo1``), kept so that checkpoints written before Neo moved to
``torch.distributed.checkpoint`` still load (:func:`load_checkpoint`); :func:`save_checkpoint`
writes it only for the tests of that path.

Checkpoints: sharded embeddings with their optimizer state, dense model and optimizer, LR
schedule step, data position and RNG; written atomically; loadable under another plan or world size.

Layout of ``DIR/step-<N>/`` (one directory per checkpoint)::

    meta.json         step, world size W, local world size, the plan (JSON), global samples seen
    dense.pt          rank 0: dense model state (no embedding), dense optimizer state
    shards-<r>.pt     rank r: {"records": [{table, sharding_type, row_offset, rows, col_offset, cols}],
                               "tensors": {"<i>.weight": (rows, cols), "<i>.<state>": (rows, cols) | (rows,)},
                               "optimizer_step": fused optimizer steps}
    rank-<r>.pt       rank r: loader state, RNG states (torch, numpy, python)
    DIR/latest        text file: the name of the newest complete checkpoint directory

Atomicity: every rank writes into ``DIR/tmp-<N>/``; once all ranks report success (an
AllReduce of a failure flag), rank 0 renames it to ``DIR/step-<N>`` and replaces ``DIR/latest``
by ``os.replace`` of a small file. A crash while writing leaves ``latest`` pointing at the
previous complete checkpoint; the stale ``tmp-<N>`` is removed by the next save. (Multi-node
runs need ``DIR`` on a shared file system.)

Resharding: a rank loading the checkpoint walks the shards the *current* plan gives it and
copies each one's intersection with every saved shard of the same table (files are
memory-mapped, so only the rows needed are read). Data-parallel tables are read from one saved
replica; per-row optimizer state of column-split tables from the saved shard holding the
target's first column. The data position: under the same world size each rank's loader state is
restored exactly; under another world size the epoch and the global number of samples consumed
are kept (each rank resumes at ``sum(old positions) // W_new`` of its new shard), so the run
continues at the same global sample count but not with the identical sample order.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from neo.train.checkpoint.dcp_state import dense_tensors, embedding_prefixes
from neo.train.checkpoint.layout import CheckpointError, commit, latest_checkpoint, step_dir, tmp_dir

__all__ = ["save_checkpoint", "load_checkpoint"]


def _agree(ok: bool, pg) -> bool:
    """True on every rank when ``ok`` on every rank (one AllReduce)."""
    if pg.world_size == 1:
        return ok
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag, group=pg.world)
    return int(flag) == 0


def _local_shards(sharded):
    """(local table name, table config, Shard, sharding type) of this rank's shards."""
    out = []
    for t in sharded.tables:
        tp = sharded.plan.tables[t.name]
        for k, s in enumerate(tp.shards):
            if s.rank == sharded.pg.rank:
                out.append((f"{t.name}#{k}", t, s, tp.sharding_type.value))
    return out


def _shard_payload(sharded) -> Dict[str, Any]:
    records, tensors = [], {}
    lookup = sharded.lookup
    for i, (local, t, s, st) in enumerate(_local_shards(sharded)):
        records.append(dict(table=t.name, sharding_type=st, row_offset=s.row_offset, rows=s.rows,
                            col_offset=s.col_offset, cols=s.cols, optimizer=t.optimizer.type.value))
        tensors[f"{i}.weight"] = lookup.table_weight(local).clone()
        for name, v in lookup.table_optimizer_state(local).items():
            tensors[f"{i}.{name}"] = v.clone()
    steps = lookup.optimizer_steps() if lookup is not None else {}
    return {"records": records, "tensors": tensors, "optimizer_step": max(steps.values(), default=0)}


def save_checkpoint(root: str, step: int, *, sharded, dense_model, optimizer, loader_state: Dict[str, Any],
                    pg, meta: Optional[Dict[str, Any]] = None, keep: int = 2,
                    save_fn: Callable[[Any, str], None] = torch.save) -> str:
    """Write ``root/step-<step>`` atomically (collective: every rank calls it). Returns the path.

    ``dense_model`` is the DLRM (its ``embedding.*`` entries are skipped: the shards carry them).
    ``save_fn(obj, path)`` writes one file (tests inject failures through it).
    """
    tmp, final = tmp_dir(root, step), step_dir(root, step)
    if pg.rank == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)            # a stale one from a crashed save
        os.makedirs(tmp)
    if pg.world_size > 1:
        dist.barrier(group=pg.world)
    error: Optional[BaseException] = None
    try:
        save_fn(_shard_payload(sharded), os.path.join(tmp, f"shards-{pg.rank}.pt"))
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        save_fn({"loader": loader_state, "rng": rng}, os.path.join(tmp, f"rank-{pg.rank}.pt"))
        if pg.rank == 0:
            dense = dense_tensors(dense_model)
            save_fn({"model": dense, "optimizer": optimizer.state_dict()}, os.path.join(tmp, "dense.pt"))
            info = dict(meta or {}, step=step, world_size=pg.world_size, local_world_size=pg.local_world_size,
                        plan=sharded.plan.to_dict() if hasattr(sharded.plan, "to_dict") else None)
            with open(os.path.join(tmp, "meta.json"), "w") as f:
                json.dump(info, f, indent=1, default=str)
    except BaseException as e:  # noqa: BLE001 - every rank must learn of it
        error = e
    if not _agree(error is None, pg):
        raise CheckpointError(f"checkpoint of step {step} failed on some rank; {latest_checkpoint(root)} "
                              f"is still the latest") from error
    if pg.rank == 0:
        commit(root, step, keep)                          # the same atomic rename and pointer as DCP's
    if pg.world_size > 1:
        dist.barrier(group=pg.world)
    return final


def _overlap(a0: int, an: int, b0: int, bn: int):
    lo, hi = max(a0, b0), min(a0 + an, b0 + bn)
    return (lo, hi) if lo < hi else None


@torch.no_grad()
def _load_shards(path: str, saved_world: int, sharded) -> None:
    files = [torch.load(os.path.join(path, f"shards-{r}.pt"), mmap=True, weights_only=True) for r in range(saved_world)]
    by_table: Dict[str, List[tuple]] = {}
    dp_seen = set()
    for f in files:
        for i, rec in enumerate(f["records"]):
            if rec["sharding_type"] == "data_parallel":
                if rec["table"] in dp_seen:
                    continue                                  # one replica is enough
            by_table.setdefault(rec["table"], []).append((rec, f["tensors"], i))
        dp_seen.update(r["table"] for r in f["records"] if r["sharding_type"] == "data_parallel")
    lookup = sharded.lookup
    for local, t, s, _ in _local_shards(sharded):
        saved = by_table.get(t.name)
        if not saved:
            raise CheckpointError(f"checkpoint {path} has no shards of table '{t.name}'")
        if saved[0][0]["optimizer"] != t.optimizer.type.value:
            raise CheckpointError(f"table '{t.name}': checkpoint optimizer {saved[0][0]['optimizer']!r}, "
                                  f"config {t.optimizer.type.value!r}")
        weight, states = lookup.table_weight(local), lookup.table_optimizer_state(local)
        covered = 0
        for rec, tensors, i in saved:
            rows = _overlap(s.row_offset, s.rows, rec["row_offset"], rec["rows"])
            cols = _overlap(s.col_offset, s.cols, rec["col_offset"], rec["cols"])
            if rows is None:
                continue
            (r0, r1) = rows
            dst_r, src_r = slice(r0 - s.row_offset, r1 - s.row_offset), slice(r0 - rec["row_offset"], r1 - rec["row_offset"])
            if cols is not None:
                (c0, c1) = cols
                dst_c, src_c = slice(c0 - s.col_offset, c1 - s.col_offset), slice(c0 - rec["col_offset"], c1 - rec["col_offset"])
                weight[dst_r, dst_c] = tensors[f"{i}.weight"][src_r, src_c].to(weight.dtype)
                covered += (r1 - r0) * (c1 - c0)
            for name, st in states.items():
                src = tensors[f"{i}.{name}"]
                if st.dim() == 1:                             # per-row state: from the shard holding our first column
                    if rec["col_offset"] <= s.col_offset < rec["col_offset"] + rec["cols"]:
                        st[dst_r] = src[src_r]
                elif cols is not None:
                    st[dst_r, dst_c] = src[src_r, src_c]
        if covered != s.rows * s.cols:
            raise CheckpointError(f"table '{t.name}': saved shards cover {covered} of the {s.rows * s.cols} "
                                  f"values of rows [{s.row_offset}, +{s.rows}) cols [{s.col_offset}, +{s.cols})")
    step = max(f["optimizer_step"] for f in files)
    if lookup is not None:
        lookup.set_optimizer_steps(step)                       # fused optimizer counters (Adam bias correction)


def load_checkpoint(path: str, *, sharded, dense_model, optimizer, loader, pg, restore_rng: bool = True) -> Dict[str, Any]:
    """Restore a checkpoint into the current (possibly differently sharded) job; returns meta.json."""
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    W0 = int(meta["world_size"])
    _load_shards(path, W0, sharded)
    dense = torch.load(os.path.join(path, "dense.pt"), weights_only=False)
    missing, unexpected = dense_model.load_state_dict(dense["model"], strict=False)
    missing = [k for k in missing if not k.startswith(embedding_prefixes(dense_model))]
    if missing or unexpected:
        raise CheckpointError(f"dense model does not fit the checkpoint: missing {missing}, unexpected {unexpected}")
    optimizer.load_state_dict(dense["optimizer"])
    if W0 == pg.world_size:
        mine = torch.load(os.path.join(path, f"rank-{pg.rank}.pt"), weights_only=False)
        if loader is not None:
            loader.load_state_dict(mine["loader"])
        if restore_rng:
            torch.set_rng_state(mine["rng"]["torch"])
            np.random.set_state(mine["rng"]["numpy"])
            random.setstate(mine["rng"]["python"])
    elif loader is not None:
        olds = [torch.load(os.path.join(path, f"rank-{r}.pt"), weights_only=False)["loader"] for r in range(W0)]
        total = sum(int(o["position"]) for o in olds)
        state = loader.state_dict()
        state.update(epoch=int(olds[0]["epoch"]), position=min(total // pg.world_size, loader.shard_size))
        loader.load_state_dict(state)
    return meta
