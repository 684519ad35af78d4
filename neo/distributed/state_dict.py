"""A sharded collection's tables in a state dict, by table and with global offsets (TorchRec's way).

Keys, as the unsharded :class:`~neo.embedding.TableBatchedEmbedding`'s (under the module's prefix)::

    <table>.weight             (rows, D)   ShardedTensor: every shard at its global (row, column)
                                           offset; this rank's local shards are views of its live
                                           shard weights (DCP loads straight into them)
    <table>.<state>            (rows, D) per element, or (rows,) per row: laid out the same way
    <table>.<state>@<c0>:<c1>  (rows,)     per-row state (row-wise Adagrad) of the column band
                                           [c0, c1) of a table split by columns (see below)
    <table>.step               int64 ()    the fused optimizer's updates (Adam / LAMB bias correction):
                                           a copy of the count when the state dict was taken, set
                                           by load_state_dict; only on the ranks that hold a shard
                                           of the table (see :func:`save_tables`)

A data-parallel table's entries are this rank's replica, plain tensors (every replica is equal:
DCP writes one). Neo's own checkpoints (:mod:`neo.train.checkpoint.dcp_state`) hold the same
entries under ``embedding.<table>.``; both are built here (:func:`table_layout`, :func:`entry_value`).

Per-row state of a table split by columns: row-wise Adagrad keeps, per row, the running sum of
the mean of g^2 over a SHARD's columns, so each column band has its own, which is not the
table's. It is kept per band, under band keys, in state dicts and checkpoints alike: it loads
into the same bands only (another layout is an error naming the table; Neo's checkpoint
loader blends bands instead, see dcp_state).

Loading (:func:`load_tables`) accepts, per entry, a ShardedTensor holding this rank's shards
(what ``dcp.load`` filled: the live tensors themselves, or copies of the same shards) or a plain
tensor of the full table (an unsharded module's state dict, a converted checkpoint): each rank
copies its own shards' slices. A state dict of the earlier rank-local keys
(``lookup.<table>#<k>.*``, same plan and rank) is left to the local module, which checks it.

Cached tables (``placement: cached``): their entries are views of the backing store, written
back and emptied of cached rows when the views are taken (as the unsharded module does). They
are live until a lookup or prefetch brings rows back into the cache: take ``state_dict()``
right before ``dcp.save`` / ``dcp.load``. Loading refuses (naming the table) when rows trained
since then would be written back over what ``dcp.load`` read into the store.

ShardedTensor carries the shard offsets; torch marks it deprecated in favour of DTensor, whose
placements cannot express Neo's uneven row and column blocks, so its deprecation message is
filtered out (a process-wide filter on that one message: it is printed for ShardedTensors
made elsewhere neither).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch.distributed._shard.sharded_tensor import Shard as TorchShard
from torch.distributed._shard.sharded_tensor import ShardedTensor, ShardMetadata
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

from neo.config.embedding import TableConfig
from neo.planner.types import ShardingType

if TYPE_CHECKING:
    from neo.distributed.sharded_embedding import ShardedEmbeddingCollection

__all__ = ["Block", "Piece", "Entry", "LoadRecord", "sharded_tensor", "band_key", "parse_band", "table_shards",
           "table_layout", "piece_view", "entry_value", "save_tables", "load_tables", "drop_local_keys"]

warnings.filterwarnings("ignore", message="Please use DTensor instead and we are deprecating ShardedTensor",
                        category=FutureWarning)

Block = Tuple[int, Tuple[int, ...], Tuple[int, ...]]
"""One shard of an entry: (rank, global offsets, sizes)."""


@dataclass(frozen=True)
class Piece:
    """This rank's part of an entry: the shard table ``local`` (``<table>#<k>`` of the local
    module) at global ``offsets`` with ``sizes``."""
    local: str
    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]

    def region(self) -> Tuple[slice, ...]:
        return tuple(slice(o, o + n) for o, n in zip(self.offsets, self.sizes))


@dataclass(frozen=True)
class Entry:
    """One state-dict entry of a table, from the plan alone (no tensor is touched).

    ``key``: ``weight``, a state name, or a state's :func:`band_key`; ``state``: None for the
    weight; ``blocks``: every rank's shards, None for a data-parallel replica (a plain tensor);
    ``pieces``: this rank's."""
    key: str
    state: Optional[str]
    size: Tuple[int, ...]
    dtype: torch.dtype
    blocks: Optional[List[Block]]
    pieces: List[Piece]


# ---------------------------------------------------------------------- ShardedTensor
def _placement(rank: int, device: torch.device, local_world_size: int) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else rank % local_world_size
        return f"rank:{rank}/cuda:{index}"
    return f"rank:{rank}/{device.type}"


def sharded_tensor(size: Tuple[int, ...], blocks: Sequence[Block], local: Sequence[torch.Tensor],
                   dtype: torch.dtype, device: torch.device, pg) -> ShardedTensor:
    """A ShardedTensor of global ``size`` whose shards are ``blocks``; ``local`` holds this rank's
    blocks' tensors in block order (used as they are: views stay views). ``device``: where
    this rank's shards live (other ranks' are placed on the same kind of device)."""
    here = local[0].device if local else device
    metas = [ShardMetadata(list(off), list(sz),
                           _placement(r, here if r == pg.rank else device, pg.local_world_size))
             for r, off, sz in blocks]
    mine = [m for (r, _, _), m in zip(blocks, metas) if r == pg.rank]
    shards = [TorchShard(t, m) for t, m in zip(local, mine)]
    props = TensorProperties(dtype=dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format,
                             pin_memory=bool(local) and local[0].is_pinned())
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, ShardedTensorMetadata(metas, torch.Size(size), props), process_group=pg.world)


# ---------------------------------------------------------------------- band keys
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


# ---------------------------------------------------------------------- layout
def table_shards(sec: "ShardedEmbeddingCollection", name: str):
    """(shard index, Shard) of every non-empty shard of table ``name``, every rank's."""
    return [(k, s) for k, s in enumerate(sec.plan.tables[name].shards) if s.rows and s.cols]


def _per_row_entries(t: TableConfig, shards, rank: int, name: str) -> List[Entry]:
    """One (rows,) entry per column band of a per-row state (one when not split by columns)."""
    bands = sorted({(s.col_offset, s.col_offset + s.cols) for _, s in shards})
    out = []
    for c0, c1 in bands:
        band = [(k, s) for k, s in shards if s.col_offset == c0]
        blocks = [(s.rank, (s.row_offset,), (s.rows,)) for _, s in band]
        pieces = [Piece(f"{t.name}#{k}", (s.row_offset,), (s.rows,)) for k, s in band if s.rank == rank]
        key = name if len(bands) == 1 else band_key(name, c0, c1)
        out.append(Entry(key, name, (t.num_rows,), torch.float32, blocks, pieces))
    return out


def table_layout(sec: "ShardedEmbeddingCollection", t: TableConfig) -> List[Entry]:
    """Table ``t``'s entries (weight, then optimizer state) on this rank, without ``step``."""
    rank = sec.pg.rank
    tp = sec.plan.tables[t.name]
    shards = table_shards(sec, t.name)
    full = (t.num_rows, t.dim)
    states = t.optimizer.type.state_names()
    if tp.sharding_type is ShardingType.DATA_PARALLEL:       # one full replica per rank, all equal
        (k, _), = [(k, s) for k, s in shards if s.rank == rank]
        per_row = t.optimizer.type.rowwise_state
        piece = lambda size: [Piece(f"{t.name}#{k}", (0,) * len(size), size)]      # noqa: E731
        out = [Entry("weight", None, full, t.dtype.torch_dtype, None, piece(full))]
        return out + [Entry(n, n, (t.num_rows,) if per_row else full, torch.float32, None,
                            piece((t.num_rows,) if per_row else full)) for n in states]
    blocks = [(s.rank, (s.row_offset, s.col_offset), (s.rows, s.cols)) for _, s in shards]
    pieces = [Piece(f"{t.name}#{k}", (s.row_offset, s.col_offset), (s.rows, s.cols))
              for k, s in shards if s.rank == rank]
    out = [Entry("weight", None, full, t.dtype.torch_dtype, blocks, pieces)]
    for name in states:
        if t.optimizer.type.rowwise_state:
            out += _per_row_entries(t, shards, rank, name)
        else:
            out.append(Entry(name, name, full, torch.float32, blocks, pieces))
    return out


def piece_view(lookup, entry: Entry, piece: Piece) -> torch.Tensor:
    """The live tensor of ``piece`` (a cached shard's: its backing store, see module doc)."""
    if entry.state is None:
        return lookup.table_weight(piece.local)
    return lookup.table_optimizer_state(piece.local)[entry.state]


def entry_value(sec: "ShardedEmbeddingCollection", entry: Entry) -> torch.Tensor:
    """The entry over this rank's live tensors: a ShardedTensor, or the replica itself."""
    views = [piece_view(sec.lookup, entry, p) for p in entry.pieces]
    if entry.blocks is None:
        return views[0]
    return sharded_tensor(entry.size, entry.blocks, views, entry.dtype, sec.device, sec.pg)


# ---------------------------------------------------------------------- saving
def _local_steps(sec: "ShardedEmbeddingCollection") -> Dict[str, int]:
    """The fused-update count of each table with a shard on this rank (no collective): its
    shards' group counter. Tables with no shard here are left out: this rank does not know
    their count (tables of other groups take their own updates, e.g. one loaded or added later)."""
    if sec.lookup is None:
        return {}
    local = sec.lookup.optimizer_steps()
    out = {}
    for t in sec.tables:
        mine = [f"{t.name}#{k}" for k, s in table_shards(sec, t.name) if s.rank == sec.pg.rank]
        if mine:
            out[t.name] = local[mine[0]]
    return out


def save_tables(sec: "ShardedEmbeddingCollection", destination: Dict[str, Any], prefix: str) -> None:
    """Every table's entries into ``destination`` under ``prefix`` (see module doc).

    ``<table>.step`` is there only on the ranks that hold a shard of the table (DCP writes one
    of their counts, all equal); it is a copy of the count at the time of the call."""
    steps = _local_steps(sec)
    for t in sec.tables:
        for e in table_layout(sec, t):
            destination[f"{prefix}{t.name}.{e.key}"] = entry_value(sec, e)
        if t.name in steps:
            destination[f"{prefix}{t.name}.step"] = torch.tensor(steps[t.name], dtype=torch.int64, device=sec.device)


# ---------------------------------------------------------------------- loading
@dataclass
class LoadRecord:
    """What a load found, for the post-load hook: the keys it took, whether the state dict
    held the earlier rank-local keys (``lookup.<table>#<k>.*``, loaded by the local module)."""
    prefix: str
    taken: Set[str]
    rank_local: bool


def _describe(value: Any) -> str:
    if isinstance(value, ShardedTensor):
        md = value.metadata()
        return f"a ShardedTensor {tuple(md.size)} {md.tensor_properties.dtype}"
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype}"
    return type(value).__name__


def _what(t: TableConfig) -> str:
    return f"{t.num_rows} rows x dim {t.dim}, {t.dtype.value}, {t.optimizer.type.value}"


def _sources(t: TableConfig, key: str, entry: Entry, value: Any) -> Tuple[Optional[List[torch.Tensor]], str]:
    """This rank's source tensor of each of ``entry``'s pieces, or (None, why not)."""
    if isinstance(value, ShardedTensor):
        md = value.metadata()
        if tuple(md.size) != entry.size or md.tensor_properties.dtype != entry.dtype:
            return None, (f"{key} is {_describe(value)} in the state dict, {entry.size} {entry.dtype} here "
                          f"({_what(t)})")
        held = {(tuple(s.metadata.shard_offsets), tuple(s.metadata.shard_sizes)): s.tensor
                for s in value.local_shards()}
        out = []
        for p in entry.pieces:
            src = held.get((p.offsets, p.sizes))
            if src is None:
                has = ", ".join(f"{list(o)} size {list(n)}" for o, n in sorted(held)) or "none"
                return None, (f"{key} is a ShardedTensor of other shards (this rank's: at {list(p.offsets)} size "
                              f"{list(p.sizes)}; its local ones: {has}): load it with dcp.load into this "
                              "collection's own state_dict(), or give the full table")
            out.append(src)
        return out, ""
    if isinstance(value, torch.Tensor) and tuple(value.shape) == entry.size and value.dtype == entry.dtype:
        return [value[p.region()] for p in entry.pieces], ""
    return None, f"{key} is {_describe(value)} in the state dict, {entry.size} {entry.dtype} here ({_what(t)})"


def _other_layout(state_dict: Dict[str, Any], stem: str, entry: Entry) -> List[str]:
    """Keys of the same per-row state in another column-band layout (e.g. ``sum`` for ``sum@0:6``)."""
    if entry.state is None or len(entry.size) != 1:
        return []
    return sorted(k for k in state_dict if k == stem + entry.state or k.startswith(stem + entry.state + "@"))


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _writebacks(lookup) -> Dict[str, int]:
    """Rows written back to the store so far, per cached shard table."""
    if lookup is None or not lookup.has_cache:
        return {}
    return {name: s.writebacks for name, s in lookup.cache_stats().items()}


@torch.no_grad()
def load_tables(sec: "ShardedEmbeddingCollection", state_dict: Dict[str, Any], prefix: str,
                missing_keys: List[str], error_msgs: List[str]) -> LoadRecord:
    """Copy every table's entries of ``state_dict`` into this rank's shards (see module doc).

    Absent keys go to ``missing_keys``; a wrong shape or dtype, a ShardedTensor of other shards
    or per-row state of another column-band layout to ``error_msgs``, naming the table."""
    if any(k.startswith(f"{prefix}lookup.") and "#" in k for k in state_dict):
        return LoadRecord(prefix, set(), rank_local=True)    # the earlier keys: the local module loads them
    taken: Set[str] = set()
    refused: Set[Tuple[str, Optional[str]]] = set()          # (table, per-row state) of another band layout
    work: List[Tuple[TableConfig, str, Entry, List[torch.Tensor]]] = []
    for t in sec.tables:
        stem = f"{prefix}{t.name}."
        for e in table_layout(sec, t):
            key = stem + e.key
            taken.add(key)
            if key not in state_dict:
                other = _other_layout(state_dict, stem, e)
                if other and (t.name, e.state) in refused:
                    continue
                if other:
                    refused.add((t.name, e.state))
                    here = [stem + x.key for x in table_layout(sec, t) if x.state == e.state]
                    error_msgs.append(f"table '{t.name}': its per-row optimizer state '{e.state}' is {here} here, "
                                      f"the state dict has {other}: the per-row state of a column "
                                      "band is not the table's (row-wise Adagrad averages g^2 over a shard's "
                                      "columns), so it loads into the same bands only (Neo's checkpoint "
                                      "loader, neo.train.checkpoint, blends bands)")
                else:
                    missing_keys.append(key)
                continue
            sources, why = _sources(t, key, e, state_dict[key])
            if sources is None:
                error_msgs.append(f"table '{t.name}': {why}")
                continue
            work.append((t, key, e, sources))
        step_key = f"{stem}step"
        taken.add(step_key)
        if any(sh.rank == sec.pg.rank for _, sh in table_shards(sec, t.name)):   # others take no updates of it
            _load_step(sec, t, step_key, state_dict, missing_keys, error_msgs)
    before = _writebacks(sec.lookup)
    views = [[piece_view(sec.lookup, e, p) for p in e.pieces] for _, _, e, _ in work]   # flushes cached tables
    after = _writebacks(sec.lookup)
    flushed = {name for name, n in after.items() if n != before.get(name, n)}
    overwritten: Set[str] = set()
    for (t, key, e, sources), dsts in zip(work, views):
        for p, src, dst in zip(e.pieces, sources, dsts):
            if p.local in flushed and _shares_storage(src, dst):
                if p.local not in overwritten:
                    overwritten.add(p.local)
                    error_msgs.append(f"table '{t.name}': dcp.load read it into the backing store of its cached "
                                      f"shard {p.local}, then rows trained since state_dict() was taken were "
                                      "written back over it: take state_dict() right before dcp.load, and "
                                      "load_state_dict before the next step")
                continue
            if not _same_memory(src, dst):                  # dcp.load wrote into the live tensor: nothing to do
                dst.copy_(src)
    return LoadRecord(prefix, taken, rank_local=False)


def _load_step(sec: "ShardedEmbeddingCollection", t: TableConfig, key: str, state_dict: Dict[str, Any],
               missing_keys: List[str], error_msgs: List[str]) -> None:
    """Set the update counter of this rank's shards of ``t`` (ignored where it holds none)."""
    if key not in state_dict:
        missing_keys.append(key)
        return
    src = state_dict[key]
    if not isinstance(src, torch.Tensor) or isinstance(src, ShardedTensor) or src.shape != () \
            or src.dtype != torch.int64:
        error_msgs.append(f"table '{t.name}': {key} is {_describe(src)} in the state dict, () torch.int64 here")
        return
    for k, s in table_shards(sec, t.name):
        if s.rank == sec.pg.rank:
            sec.lookup.set_optimizer_steps(int(src), table=f"{t.name}#{k}")


def drop_local_keys(sec: "ShardedEmbeddingCollection", keys: List[str], prefix: str) -> List[str]:
    """``keys`` without the local module's own (``<prefix>lookup.<table>#<k>.*``)."""
    if sec.lookup is None:
        return keys
    local = tuple(f"{prefix}lookup.{s.name}." for s in sec.lookup.tables)
    return [k for k in keys if not k.startswith(local)]
