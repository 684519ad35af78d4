"""Reading a checkpoint: choosing the newest intact one, loading it into the current job.

:func:`find_resumable` walks the candidates (``latest`` first, then every ``step-<N>`` newest
first), verifies each one's checksums across the ranks and returns the first intact one; a
damaged one is reported (its damaged files named) and skipped. :func:`load_checkpoint`
reads either format into the job's current plan and world size:

- ``dcp``: ``dcp.load`` into this rank's shard views, resharded by DCP from whichever saved
  chunks overlap them;
- ``neo1`` (earlier versions): :func:`neo.train.checkpoint.legacy.load_checkpoint`.

The data position: under the same world size each rank's loader state (and RNG state) is
restored exactly; under another world size the epoch and the global number of samples
consumed are kept (each rank resumes at ``sum(old positions) // W_new`` of its new shard).
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from neo.train.checkpoint import legacy
from neo.train.checkpoint.dcp_state import dense_state, embedding_state, load_dense, restore_rank_state
from neo.train.checkpoint.integrity import verify_checkpoint
from neo.train.checkpoint.layout import (FORMAT_DCP, FORMAT_NEO1, CheckpointError, candidates, checkpoint_format,
                                        error_summary)

__all__ = ["find_resumable", "load_checkpoint"]


def find_resumable(root: str, pg, say: Callable[[str], None] = print) -> Optional[str]:
    """The newest intact checkpoint under ``root`` (None when there is none at all). Collective.

    Raises :class:`CheckpointError` when checkpoints exist but every one is damaged (naming
    the damage), rather than silently starting over."""
    problems: List[str] = []
    for path in candidates(root):
        fmt = checkpoint_format(path)
        if fmt == FORMAT_NEO1:
            return path                                          # no checksums in that format
        error = verify_checkpoint(path, pg) if fmt == FORMAT_DCP else f"{path}: no .metadata: the save did not finish"
        if error is None:
            for p in problems:
                say(f"neo train: skipped a damaged checkpoint: {p}")
            return path
        problems.append(error)
    if problems:
        raise CheckpointError("no intact checkpoint under " + root + ": " + " | ".join(problems) +
                              " (set train.resume=false to start over)")
    return None


def load_checkpoint(path: str, *, sharded, dense_model, optimizer, loader, pg,
                    restore_rng: bool = True) -> Dict[str, Any]:
    """Restore a checkpoint into the current (possibly differently sharded) job; returns its meta."""
    fmt = checkpoint_format(path)
    if fmt == FORMAT_NEO1:
        try:
            return legacy.load_checkpoint(path, sharded=sharded, dense_model=dense_model, optimizer=optimizer,
                                          loader=loader, pg=pg, restore_rng=restore_rng)
        except (OSError, RuntimeError, KeyError, EOFError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{path}: unreadable checkpoint of the earlier format (neo1): {e}") from e
    if fmt != FORMAT_DCP:
        raise CheckpointError(f"{path} is not a checkpoint: neither torch.distributed.checkpoint's .metadata "
                              "nor the earlier format's meta.json and shards-0.pt are there")
    try:
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{os.path.join(path, 'meta.json')}: missing or unreadable: {e}") from e
    saved_opt, now_opt = meta.get("dense_optimizer"), type(optimizer).__name__ if optimizer is not None else None
    if saved_opt is not None and now_opt is not None and saved_opt != now_opt:
        raise CheckpointError(f"{path}: the checkpoint's dense optimizer is {saved_opt}, this job's is {now_opt} "
                              f"(optim.type differs): its state cannot be loaded into another optimizer; resume "
                              f"with the checkpoint's optim.type, or start afresh (train.resume=false)")
    # imported here, not with the module: torch.distributed.checkpoint brings in DTensor and sympy,
    # 0.6 to 0.9 s of every `neo train`'s start on a 2-core VM, though most runs never load a checkpoint
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    W0 = int(meta["world_size"])
    same_world = W0 == pg.world_size
    md = dcp.FileSystemReader(path).read_metadata()
    _check_tables(path, sharded, md)
    emb, after = embedding_state(sharded, for_load=True, saved=list(md.state_dict_metadata))
    dense = dense_state(dense_model, optimizer)
    _check_dense(path, dense["model"], md)
    ranks = [pg.rank] if same_world else list(range(W0))
    state: Dict[str, Any] = {"embedding": emb, "dense": dense, "embedding_optimizer_step": 0,
                             "ranks": {str(r): b"" for r in ranks}}
    try:
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), process_group=pg.checkpoint,
                 planner=_load_planner())
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP raises CheckpointException (a
        # BaseException: a shape or key of the dense model or its optimizer that differs), RuntimeError, KeyError
        raise CheckpointError(f"{path}: torch.distributed.checkpoint could not load it into this job (the model, "
                              f"its optimizer or the tables differ from the checkpoint's config?): "
                              f"{error_summary(e)}") from None
    with torch.no_grad():
        for fix in after:
            fix()
    load_dense(dense_model, optimizer, state["dense"])
    if sharded.lookup is not None:
        sharded.lookup.set_optimizer_steps(int(state["embedding_optimizer_step"]))
    mine = {int(r): restore_rank_state(b) for r, b in state["ranks"].items()}
    if same_world:
        own = mine[pg.rank]
        if loader is not None:
            try:
                loader.load_state_dict(own["loader"])
            except ValueError as e:      # e.g. another data seed or sample count than the checkpoint's
                raise CheckpointError(f"{path}: the data loader's position does not fit this run's data: {e} "
                                      "(train.seed and the data section must be those of the checkpointed run)") from None
        if restore_rng:
            torch.set_rng_state(own["rng"]["torch"])
            np.random.set_state(own["rng"]["numpy"])
            random.setstate(own["rng"]["python"])
    elif loader is not None:
        total = sum(int(s["loader"]["position"]) for s in mine.values())
        new = loader.state_dict()
        new.update(epoch=int(mine[0]["loader"]["epoch"]), position=min(total // pg.world_size, loader.shard_size))
        loader.load_state_dict(new)
    return meta


def _load_planner():
    """DCP's default load planner without its fallback to the key format of torch <= 2.3.

    When the checkpoint holds keys the load state dict lacks (a table none of whose shards is
    on this rank, other ranks' loader states), the default planner re-flattens the state dict
    the pre-2.4 way if any of those keys exist in that format too, which turns
    ``dense.optimizer.param_groups`` into one key the checkpoint does not have. Neo's
    checkpoints are all written by torch >= 2.4: the plain local plan is the right one. (A
    class made at the call: DCP is imported only when a checkpoint is loaded.)"""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, create_default_local_load_plan

    class LoadPlanner(DefaultLoadPlanner):
        def create_local_plan(self):
            return create_default_local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)

    return LoadPlanner()


def _check_dense(path: str, tensors: Dict[str, Any], md) -> None:
    """Name a dense parameter or buffer this job has and the checkpoint lacks, or whose shape
    differs (a changed ``model`` section), before DCP's load reports it as a traceback."""
    saved = md.state_dict_metadata
    theirs = sorted(k[len("dense.model."):] for k in saved if k.startswith("dense.model."))
    for name, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            continue
        key = f"dense.model.{name}"
        if key not in saved:
            raise CheckpointError(f"{path}: the checkpoint has no dense tensor '{name}' (it has {theirs}); "
                                  "was it saved with another model section?")
        size = tuple(getattr(saved[key], "size", ()))
        if size != tuple(v.shape):
            raise CheckpointError(f"{path}: dense tensor '{name}' is {size} in the checkpoint, {tuple(v.shape)} here "
                                  "(the model section differs from the checkpoint's, or the data's dense features: "
                                  "the bottom MLP's first layer takes num_dense inputs)")


def _check_tables(path: str, sharded, md) -> None:
    """Name a table (or optimizer state) this job has and the checkpoint lacks, or a shape change."""
    saved = md.state_dict_metadata
    for t in sharded.tables:
        for name in ("weight",) + tuple(t.optimizer.type.state_names()):
            key = f"embedding.{t.name}.{name}"
            bands = [k for k in saved if k.startswith(key + "@")]
            if bands:                                    # per-row state of a column-split table, per band
                key = bands[0]
            if key not in saved:
                what = "table" if name == "weight" else f"optimizer state '{name}' of table"
                raise CheckpointError(f"{path}: the checkpoint has no {what} '{t.name}' (key {key}); "
                                      "was it saved with other tables or another optimizer?")
            size = tuple(getattr(saved[key], "size", ()))
            want = (t.num_rows, t.dim) if name == "weight" or not t.optimizer.type.rowwise_state else (t.num_rows,)
            if size != want:
                raise CheckpointError(f"{path}: table '{t.name}' {name} is {size} in the checkpoint, {want} here")
