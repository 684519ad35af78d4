"""The ``torch.distributed.checkpoint`` (DCP) state dict of a training job.

Keys (DCP flattens nested dicts with dots)::

    embedding.<table>.weight     (rows, D)   a ShardedTensor of the table's shards, each at its
                                             global (row, column) offset, written by its rank
    embedding.<table>.<state>    (rows, D) per element, or (rows,) per row (row-wise Adagrad)
    embedding.<table>.<state>@<c0>:<c1>   (rows,) per-row state of the column band [c0, c1) of a
                                 table split by columns (each band has its own, see below)
    embedding_optimizer_step     int         fused optimizer updates (Adam / LAMB bias correction)
    dense.model.<name>           the dense modules (replicated: DCP writes each tensor once)
    dense.optimizer              torch.optim state, keyed by parameter name
                                 (``torch.distributed.checkpoint.state_dict``)
    ranks.<r>                    bytes: rank r's loader position and RNG states
    meta                         JSON text: step, world size, plan, global batch

Sharded tables are saved as their shards with global offsets, so DCP reassembles any other
plan's or world size's shards on load from whichever saved chunks overlap them (the load
planner reads only the overlapping pieces). Data-parallel tables are plain tensors (every
replica is equal: DCP writes one).

Per-row state (row-wise Adagrad: per row, the running sum of the mean of g^2 over the
shard's columns) differs between the column bands of a table split by columns, so each band
is saved under its own key. Loading into the same bands copies them bit for bit; into other
bands, each target takes the overlap-weighted average of the saved bands' values (exact for
a target covering whole saved bands, e.g. the table loaded unsplit).

DCP's own tools read the result, e.g. ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``
converts it into one ``torch.save`` file of full tables.

ShardedTensor carries the shard offsets (TorchRec's checkpoints do the same); torch marks it
deprecated in favour of DTensor, whose placements cannot express Neo's uneven row and column
blocks, so its deprecation warning is silenced for these objects only.
"""

from __future__ import annotations

import json
import pickle
import random
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.distributed._shard.sharded_tensor import Shard as TorchShard
from torch.distributed._shard.sharded_tensor import ShardedTensor, ShardMetadata
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

from neo.planner.types import ShardingType

__all__ = ["embedding_state", "dense_state", "load_dense", "rank_state", "restore_rank_state", "FORMAT_VERSION"]

FORMAT_VERSION = "neo-dcp-1"

warnings.filterwarnings("ignore", message="Please use DTensor instead and we are deprecating ShardedTensor",
                        category=FutureWarning)


def _placement(rank: int, device: torch.device, local_world_size: int) -> str:
    if device.type == "cuda":
        return f"rank:{rank}/cuda:{rank % local_world_size}"
    return f"rank:{rank}/{device.type}"


def _sharded(size: Tuple[int, ...], blocks: List[Tuple[int, Tuple[int, ...], Tuple[int, ...]]],
             local: List[torch.Tensor], like: torch.Tensor, pg) -> ShardedTensor:
    """A ShardedTensor of global ``size`` whose blocks are (rank, offsets, sizes); ``local``
    holds this rank's blocks' tensors in block order."""
    metas = [ShardMetadata(list(off), list(sz), _placement(r, like.device, pg.local_world_size))
             for r, off, sz in blocks]
    mine = [m for (r, _, _), m in zip(blocks, metas) if r == pg.rank]
    shards = [TorchShard(t, m) for t, m in zip(local, mine)]
    props = TensorProperties(dtype=like.dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, ShardedTensorMetadata(metas, torch.Size(size), props), process_group=pg.world)


def band_key(name: str, c0: int, c1: int) -> str:
    """Key of the per-row state ``name`` of the column band ``[c0, c1)`` of a column-split table."""
    return f"{name}@{c0}:{c1}"


def parse_band(key: str) -> Optional[Tuple[str, int, int]]:
    """(state name, c0, c1) of a :func:`band_key`, None for other keys."""
    name, sep, band = key.partition("@")
    if not sep:
        return None
    c0, _, c1 = band.partition(":")
    return name, int(c0), int(c1)


def _per_row_blend(dst: torch.Tensor, s, sources: List[Tuple[int, int, torch.Tensor]]) -> None:
    """Per-row state of target shard ``s`` (columns [c0, c1)) from saved bands (b0, b1, full vector).

    Row-wise Adagrad keeps, per row, the running sum of the mean over a shard's columns of
    g^2: a band that is exactly the target's is copied bit for bit; otherwise the target's
    mean is the overlap-weighted average of the saved bands' (exact when the target covers
    whole saved bands, e.g. a column-split table loaded unsplit)."""
    rows = slice(s.row_offset, s.row_offset + s.rows)
    c0, c1 = s.col_offset, s.col_offset + s.cols
    exact = [v for b0, b1, v in sources if (b0, b1) == (c0, c1)]
    if exact:
        dst.copy_(exact[0][rows])
        return
    acc = torch.zeros(s.rows, dtype=torch.float64, device=dst.device)
    for b0, b1, v in sources:
        overlap = min(b1, c1) - max(b0, c0)
        if overlap > 0:
            acc += v[rows].double() * (overlap / (c1 - c0))
    dst.copy_(acc.to(dst.dtype))


def _per_row_entries(t, shards, mine, views, name, like, pg, for_load, saved) -> Tuple[Dict[str, Any], List]:
    """Keys and load fix-ups of one per-row state (see module doc)."""
    entry: Dict[str, Any] = {}
    after: List[Callable[[], None]] = []
    device = like.device
    bands = sorted({(s.col_offset, s.col_offset + s.cols) for _, s in shards})
    if not for_load:
        for c0, c1 in bands:                                  # one key per band (one when not column-split)
            band = [(k, s) for k, s in shards if s.col_offset == c0]
            rblocks = [(s.rank, (s.row_offset,), (s.rows,)) for _, s in band]
            local = [views[k][1][name] for k, s in band if s.rank == pg.rank]
            proto = local[0] if local else torch.empty(0, dtype=torch.float32, device=device)
            entry[name if len(bands) == 1 else band_key(name, c0, c1)] = _sharded((t.num_rows,), rblocks, local, proto, pg)
        return entry, after
    saved_bands = sorted((b[1], b[2]) for b in (parse_band(k) for k in saved) if b is not None and b[0] == name)
    if not saved_bands and len(bands) == 1:                   # unsplit, saved unsplit: DCP reshards the rows
        rblocks = [(s.rank, (s.row_offset,), (s.rows,)) for _, s in shards]
        local = [views[k][1][name] for k, _ in mine]
        proto = local[0] if local else torch.empty(0, dtype=torch.float32, device=device)
        entry[name] = _sharded((t.num_rows,), rblocks, local, proto, pg)
        return entry, after
    if not mine:
        return entry, after
    sources: Dict[Tuple[int, int], torch.Tensor] = {}
    wanted = saved_bands or [(0, t.dim)]
    for _, s in mine:
        for b0, b1 in wanted:
            if min(b1, s.col_offset + s.cols) > max(b0, s.col_offset) and (b0, b1) not in sources:
                full = torch.empty(t.num_rows, dtype=torch.float32, device=device)
                sources[(b0, b1)] = full
                entry[band_key(name, b0, b1) if saved_bands else name] = full
    for k, s in mine:
        src = [(b0, b1, v) for (b0, b1), v in sources.items()]
        after.append(lambda dst=views[k][1][name], s=s, src=src: _per_row_blend(dst, s, src))
    return entry, after


def embedding_state(sharded, for_load: bool, saved: Sequence[str] = ()) -> Tuple[Dict[str, Any], List[Callable[[], None]]]:
    """``{table: {"weight": ..., state: ...}}`` over this rank's shard views, and the copies to
    run after a DCP load. ``saved``: the checkpoint's keys (loading: which per-row state bands exist)."""
    pg, lookup = sharded.pg, sharded.lookup
    out: Dict[str, Any] = {}
    after: List[Callable[[], None]] = []
    for t in sharded.tables:
        tp = sharded.plan.tables[t.name]
        shards = [(k, s) for k, s in enumerate(tp.shards) if s.rows and s.cols]
        mine = [(k, s) for k, s in shards if s.rank == pg.rank]
        entry: Dict[str, Any] = {}
        if tp.sharding_type is ShardingType.DATA_PARALLEL:     # one full replica per rank, all equal
            (k, _), = mine
            local = f"{t.name}#{k}"
            entry["weight"] = lookup.table_weight(local)
            entry.update(lookup.table_optimizer_state(local))
            out[t.name] = entry
            continue
        views = {k: (lookup.table_weight(f"{t.name}#{k}"), lookup.table_optimizer_state(f"{t.name}#{k}"))
                 for k, _ in mine}
        like = next(iter(views.values()))[0] if views else torch.empty(0)
        blocks = [(s.rank, (s.row_offset, s.col_offset), (s.rows, s.cols)) for _, s in shards]
        entry["weight"] = _sharded((t.num_rows, t.dim), blocks, [views[k][0] for k, _ in mine], like, pg)
        prefix = f"embedding.{t.name}."
        table_saved = [k[len(prefix):] for k in saved if k.startswith(prefix)]
        for name in t.optimizer.type.state_names():
            if t.optimizer.type.rowwise_state:
                more, fix = _per_row_entries(t, shards, mine, views, name, like, pg, for_load, table_saved)
                entry.update(more)
                after += fix
                continue
            local = [views[k][1][name] for k, _ in mine]
            proto = local[0] if local else torch.empty(0, dtype=torch.float32, device=like.device)
            entry[name] = _sharded((t.num_rows, t.dim), blocks, local, proto, pg)
        out[t.name] = entry
    return out, after


def embedding_prefixes(model: torch.nn.Module) -> Tuple[str, ...]:
    """The state-dict prefixes of ``model``'s embedding modules (a sharded collection or a
    table-batched module, under whatever attribute name: ``embedding.`` in Neo's DLRM, ``ebc.``
    after ``parallelize(model, "ebc", ...)``): their tensors are saved by table, not as dense ones."""
    from neo.distributed import ShardedEmbeddingCollection
    from neo.embedding import TableBatchedEmbedding

    found = tuple(f"{name}." for name, m in model.named_modules()
                  if name and isinstance(m, (ShardedEmbeddingCollection, TableBatchedEmbedding)))
    return found or ("embedding.",)


def dense_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """The dense modules' tensors (none of the embedding modules', :func:`embedding_prefixes`) and
    the dense optimizer's state by name."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    skip = embedding_prefixes(model)
    params = {k: v for k, v in model.state_dict().items() if not k.startswith(skip)}
    return {"model": params, "optimizer": get_optimizer_state_dict(model, optimizer)}


def load_dense(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    missing = [k for k in missing if not k.startswith(embedding_prefixes(model))]
    if missing or unexpected:
        from neo.train.checkpoint.layout import CheckpointError

        raise CheckpointError(f"the dense model does not fit the checkpoint: missing {missing}, "
                              f"unexpected {unexpected}")
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def rank_state(loader_state: Dict[str, Any]) -> bytes:
    """This rank's loader position and RNG states, pickled (DCP stores bytes as they are)."""
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    return pickle.dumps({"loader": loader_state, "rng": rng})


def restore_rank_state(blob: bytes) -> Dict[str, Any]:
    return pickle.loads(blob)


def meta_text(meta: Dict[str, Any]) -> str:
    return json.dumps(dict(meta, format=FORMAT_VERSION), default=str)
