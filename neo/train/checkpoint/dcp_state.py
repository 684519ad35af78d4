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

The embedding entries are those of the collection's own ``state_dict()`` (built by
:mod:`neo.distributed.state_dict`, which both use): ShardedTensors over the live shards (TorchRec's
checkpoints do the same; torch marks ShardedTensor deprecated in favour of DTensor, whose
placements cannot express Neo's uneven row and column blocks).
"""

from __future__ import annotations

import json
import pickle
import random
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch

from neo.distributed.state_dict import band_key, parse_band  # noqa: F401 (parse_band: re-exported)
from neo.distributed.state_dict import Entry, entry_value, piece_view, table_layout

__all__ = ["embedding_state", "dense_state", "dense_tensors", "load_dense", "rank_state", "restore_rank_state", "FORMAT_VERSION"]

FORMAT_VERSION = "neo-dcp-1"


def _per_row_blend(dst: torch.Tensor, rows: slice, c0: int, c1: int,
                   sources: List[Tuple[int, int, torch.Tensor]]) -> None:
    """Per-row state of a target shard (``rows`` of the table, columns [c0, c1)) from saved bands
    (b0, b1, full vector).

    Row-wise Adagrad keeps, per row, the running sum of the mean over a shard's columns of
    g^2: a band that is exactly the target's is copied bit for bit; otherwise the target's
    mean is the overlap-weighted average of the saved bands' (exact when the target covers
    whole saved bands, e.g. a column-split table loaded unsplit)."""
    exact = [v for b0, b1, v in sources if (b0, b1) == (c0, c1)]
    if exact:
        dst.copy_(exact[0][rows])
        return
    acc = torch.zeros(rows.stop - rows.start, dtype=torch.float64, device=dst.device)
    for b0, b1, v in sources:
        overlap = min(b1, c1) - max(b0, c0)
        if overlap > 0:
            acc += v[rows].double() * (overlap / (c1 - c0))
    dst.copy_(acc.to(dst.dtype))


def _band(entry: Entry, dim: int) -> Tuple[int, int]:
    """Columns [c0, c1) of a per-row state entry (the whole table when it is not split by columns)."""
    band = parse_band(entry.key)
    return (band[1], band[2]) if band is not None else (0, dim)


def _per_row_load(sharded, t, name: str, entries: List[Entry], saved: Sequence[str]) -> Tuple[Dict[str, Any], List]:
    """Load keys and fix-ups of one per-row state of a sharded table (see module doc): the
    saved bands that overlap this rank's shards are read whole, then blended into them."""
    saved_bands = sorted((b[1], b[2]) for b in (parse_band(k) for k in saved) if b is not None and b[0] == name)
    if not saved_bands and len(entries) == 1:                 # unsplit, saved unsplit: DCP reshards the rows
        return {name: entry_value(sharded, entries[0])}, []
    mine = [(_band(e, t.dim), p, piece_view(sharded.lookup, e, p)) for e in entries for p in e.pieces]
    entry: Dict[str, Any] = {}
    sources: Dict[Tuple[int, int], torch.Tensor] = {}
    wanted = saved_bands or [(0, t.dim)]
    for (c0, c1), _, view in mine:
        for b0, b1 in wanted:
            if min(b1, c1) > max(b0, c0) and (b0, b1) not in sources:
                full = torch.empty(t.num_rows, dtype=torch.float32, device=view.device)      # (rows,)
                sources[(b0, b1)] = full
                entry[band_key(name, b0, b1) if saved_bands else name] = full
    src = [(b0, b1, v) for (b0, b1), v in sources.items()]
    after = [lambda dst=view, rows=p.region()[0], band=band: _per_row_blend(dst, rows, *band, src)
             for band, p, view in mine]
    return entry, after


def embedding_state(sharded, for_load: bool,
                    saved: Sequence[str] = ()) -> Tuple[Dict[str, Any], List[Callable[[], None]]]:
    """``{table: {"weight": ..., state: ...}}`` over this rank's shard views, and the copies to
    run after a DCP load. ``saved``: the checkpoint's keys (loading: which per-row state bands exist).

    The entries are the collection's state dict's (:mod:`neo.distributed.state_dict`, without
    ``step``), but that loading a per-row state of a table split by columns, or saved so, blends
    the saved bands (see module doc)."""
    out: Dict[str, Any] = {}
    after: List[Callable[[], None]] = []
    for t in sharded.tables:
        entries = table_layout(sharded, t)
        prefix = f"embedding.{t.name}."
        table_saved = [k[len(prefix):] for k in saved if k.startswith(prefix)]
        entry: Dict[str, Any] = {}
        blended = set()
        for e in entries:
            per_row = e.blocks is not None and t.optimizer.type.rowwise_state and e.state is not None
            if not (for_load and per_row):
                entry[e.key] = entry_value(sharded, e)
            elif e.state not in blended:                       # all bands of the state at once
                blended.add(e.state)
                more, fix = _per_row_load(sharded, t, e.state, [x for x in entries if x.state == e.state],
                                          table_saved)
                entry.update(more)
                after += fix
        out[t.name] = entry
    return out, after


def _embedding_modules(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module]]:
    """(name, module) of ``model``'s Neo embedding modules, ``model`` itself included."""
    from neo.distributed import ShardedEmbeddingCollection
    from neo.embedding import TableBatchedEmbedding

    return [(n, m) for n, m in model.named_modules() if isinstance(m, (ShardedEmbeddingCollection, TableBatchedEmbedding))]


def embedding_prefixes(model: torch.nn.Module) -> Tuple[str, ...]:
    """The state-dict prefixes of ``model``'s embedding modules (a sharded collection or a
    table-batched module, under whatever attribute name: ``embedding.`` in Neo's DLRM, ``ebc.``
    after ``parallelize(model, "ebc", ...)``): their tensors are saved by table, not as dense ones."""
    found = tuple(f"{name}." if name else "" for name, _ in _embedding_modules(model))   # "": the model is one
    return found or ("embedding.",)


def dense_tensors(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """``model.state_dict()`` without the embedding modules' entries (:func:`embedding_prefixes`),
    whose own ``state_dict()`` is never called: a sharded collection's builds a ShardedTensor per
    table and state (milliseconds at hundreds of tables), here only to be dropped. Modules holding
    no embedding module give their ``state_dict()`` (hooks included); those above one (the model
    itself, a wrapper) only their own parameters and buffers, without their state-dict hooks."""
    skip = {id(m) for _, m in _embedding_modules(model)}
    if not skip:                                    # no Neo embedding module: the default prefix
        return {k: v for k, v in model.state_dict().items() if not k.startswith(embedding_prefixes(model))}
    out: Dict[str, torch.Tensor] = {}

    def visit(module: torch.nn.Module, prefix: str) -> None:
        if id(module) in skip:
            return
        if not any(id(m) in skip for m in module.modules()):
            module.state_dict(destination=out, prefix=prefix)
            return
        module._save_to_state_dict(out, prefix, False)
        for name, child in module._modules.items():
            if child is not None:
                visit(child, f"{prefix}{name}.")

    visit(model, "")
    return out


def dense_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """The dense modules' tensors (:func:`dense_tensors`) and the dense optimizer's state by name."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return {"model": dense_tensors(model), "optimizer": get_optimizer_state_dict(model, optimizer)}


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
