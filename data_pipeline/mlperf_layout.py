"""MLPerf DLRM-DCNv2's Criteo 1TB day files (TorchRec's binary layout): opened as memory maps,
checked before training, and written.

One directory, one file set per day ``N`` (the reference: days 0..23)::

    day_<N>_dense.npy                float32 (n, 13)  already transformed (the reference: a log)
    day_<N>_labels.npy               int32 (n, 1)     0 / 1   ((n,) and other numeric types read too)
    one_hot:   day_<N>_sparse.npy             int32 or int64 (n, 26), C or Fortran order
    multi_hot: day_<N>_sparse_multi_hot.npz   members "0.npy" .. "25.npy", int32 (n, k_f)

What the reference does (read in its sources):

* pytorch/torchrec ``torchrec/datasets/criteo.py`` (commit a48cef79), ``InMemoryBinaryCriteoIterDataPipe``:
  ``np.load(f, mmap_mode="r")`` of the three ``.npy`` of each day; stage ``val`` is the first
  ``len // 2 + len % 2`` rows of the (single) last day, ``test`` the rest; one-hot ids are folded
  ``% hashes`` (the table sizes) as they are read; batch ``i`` of the concatenated days goes to
  rank ``i % world_size`` (every rank takes whole per-rank batches in turn, so rank r's batch g is
  rows ``[g·W·B + r·B, +B)``); ``drop_last`` keeps ``total // B // W · W`` batches.
  ``BinaryCriteoUtils.tsv_to_npys`` writes dense ``log(x - min + 2)`` float32, labels int32 (n, 1);
  ``BinaryCriteoUtils.shuffle`` rewrites days 0..22 shuffled (sparse ``astype(int32)``) and copies
  day 23 unshuffled (its sparse file comes from ``sparse_to_contiguous``, saved transposed, hence
  Fortran order).
* mlcommons/training ``recommendation_v2/torchrec_dlrm`` (commit aa344c7f):
  ``data/dlrm_dataloader.py`` trains on ``day_{0..22}`` and evaluates on ``day_23`` (val and test
  halves as above), ``drop_last=args.drop_last_training_batch`` for training only;
  ``scripts/materialize_synthetic_multihot_dataset.py`` writes ``np.savez(day_<N>_sparse_multi_hot.npz,
  **{str(j): bags})`` (stored, not compressed; bags int32, already folded, so the reader applies no
  ``hashes``); ``data/multi_hot_criteo.py`` (``MultiHotCriteoIterDataPipe``) memory-maps each member
  at its offset inside the zip (``assert compress_type == 0``, ``assert dtype == int32``).

Here: ``.npy`` files are memory-mapped from their header (``np.memmap`` at the header's end);
``.npz`` members likewise at their offset in the archive, taken from each member's zip *local*
header (``np.load`` of an ``.npz`` reads whole arrays into memory; a compressed member cannot be
mapped and is an error). The local header matters: ``np.savez`` writes a 20-byte zip64 extra field
there that the central directory does not repeat (the reference adds a literal 20 for it).
Every size is checked against the file before training: a truncated, missing or inconsistent
file is a :class:`LayoutError` naming the file and the numbers. The loader, :class:`MlperfLoader`,
is at the end of this module; writing the files is :mod:`.mlperf_write`.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .loader import Batch, LoaderOptions, ParquetLoader, thread_nice
from .reader import first_bad_label, first_id_out_of_range, first_nonfinite, take_rows
from .schema import DatasetMeta, sparse_names
from .writer import Columns

__all__ = ["LAYOUTS", "META_FILE", "LayoutError", "Day", "Segment", "day_files", "open_day", "open_days",
           "split_segments", "check_shapes", "scan_ids", "read_layout_meta", "MlperfLoader"]

LAYOUTS = ("multi_hot", "one_hot")
META_FILE = "neo_layout.json"
"""What ``neo-data mlperf-layout`` knows about the days it wrote (rows, source, teacher AUC)."""
_ZIP_LOCAL = struct.Struct("<4s5H3L2H")  # a zip member's local header: 30 bytes, then name and extra


class LayoutError(ValueError):
    """A day file is missing, unreadable, truncated or inconsistent (the message names it)."""


def day_files(directory: str, day: int, layout: str) -> Tuple[str, str, str]:
    """(dense, sparse, labels) paths of one day."""
    sparse = f"day_{day}_sparse_multi_hot.npz" if layout == "multi_hot" else f"day_{day}_sparse.npy"
    return (os.path.join(directory, f"day_{day}_dense.npy"), os.path.join(directory, sparse),
            os.path.join(directory, f"day_{day}_labels.npy"))


# ----------------------------------------------------------------------------- memory maps
def _header(fp, where: str) -> Tuple[Tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(fp)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(fp)
        raise ValueError(f"npy format version {version} (1.0 and 2.0 are read)")
    except (ValueError, OSError, SyntaxError) as e:
        raise LayoutError(f"{where}: not a readable .npy array: {e}") from None


def _mapped(path: str, where: str, start: int, end: int) -> np.ndarray:
    """The array whose .npy bytes are ``[start, end)`` of ``path``, memory-mapped (read-only)."""
    with open(path, "rb") as fp:
        fp.seek(start)
        shape, fortran, dtype = _header(fp, where)
        data = fp.tell()
    need = data + math.prod(shape) * dtype.itemsize
    if need > end:
        row_bytes = max(1, math.prod(shape[1:]) * dtype.itemsize)
        raise LayoutError(f"{where}: truncated: its header says {dtype} {tuple(shape)} = {need - start} bytes, "
                          f"the file holds {end - start} bytes ({max(0, end - data) // row_bytes} of "
                          f"{shape[0] if shape else 1} rows)")
    if math.prod(shape) == 0:
        return np.empty(shape, dtype, order="F" if fortran else "C")
    return np.memmap(path, dtype=dtype, mode="r", offset=data, shape=shape, order="F" if fortran else "C")


def open_npy(path: str) -> np.ndarray:
    """``np.load(path, mmap_mode="r")`` with a size check that names the file and the bytes."""
    return _mapped(path, path, 0, os.path.getsize(path))


def open_npz(path: str, names: Sequence[str]) -> List[np.ndarray]:
    """Members ``<name>.npy`` of an uncompressed ``.npz``, each memory-mapped at its offset."""
    size = os.path.getsize(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise LayoutError(f"{path}: not a complete zip archive ({size} bytes; a truncated .npz loses its "
                          f"directory at the end): {e}") from None
    with zf:
        infos = {i.filename: i for i in zf.infolist()}
        if len(infos) != len(names):
            raise LayoutError(f"{path}: {len(infos)} members, expected {len(names)} (one per sparse feature: "
                              f"'0.npy' .. '{len(names) - 1}.npy')")
        out = []
        for name in names:
            info = infos.get(f"{name}.npy")
            where = f"{path}[{name}.npy]"
            if info is None:
                raise LayoutError(f"{path}: no member '{name}.npy' (members: {sorted(infos)[:30]})")
            if info.compress_type != zipfile.ZIP_STORED:
                raise LayoutError(f"{where}: compressed (np.savez_compressed); memory mapping needs the "
                                  "members stored, as np.savez writes them")
            with open(path, "rb") as fp:
                fp.seek(info.header_offset)
                sig, *_, name_len, extra_len = _ZIP_LOCAL.unpack(fp.read(_ZIP_LOCAL.size))
            if sig != b"PK\x03\x04":
                raise LayoutError(f"{where}: no zip local header at byte {info.header_offset}")
            start = info.header_offset + _ZIP_LOCAL.size + name_len + extra_len
            out.append(_mapped(path, where, start, min(start + info.file_size, size)))
    return out


# ----------------------------------------------------------------------------- days
@dataclass
class Day:
    """One day's arrays (memory maps): ``sparse`` is (n, F) for one_hot, F arrays (n, k_f) for multi_hot."""

    number: int
    paths: Tuple[str, str, str]  # dense, sparse, labels
    dense: np.ndarray  # (n, D) float
    sparse: Union[np.ndarray, List[np.ndarray]]
    labels: np.ndarray  # (n,) or (n, 1)

    @property
    def rows(self) -> int:
        return int(self.dense.shape[0])

    @property
    def one_hot(self) -> bool:
        return isinstance(self.sparse, np.ndarray)

    @property
    def bag_sizes(self) -> List[int]:
        return [1] * self.sparse.shape[1] if self.one_hot else [int(a.shape[1]) for a in self.sparse]

    def read(self, sel: Union[slice, np.ndarray]) -> Columns:
        """Rows ``sel`` (a slice or increasing indices) as numpy blocks; ids as stored. Labels
        outside [0, 1] (NaN included) and non-finite dense values are a :class:`LayoutError`
        naming the file and the day's row, as the Parquet reader refuses them (the ids are
        checked by :func:`scan_ids` and at the lookup)."""
        label = np.asarray(self.labels[sel]).reshape(-1)
        dense = np.asarray(self.dense[sel])
        bad = first_bad_label(label)
        if bad is not None:
            k, count = bad
            raise LayoutError(f"{self.paths[2]}: row {self._row(sel, k)} holds label {label[k]}, labels must be in "
                              f"[0, 1] ({count} such rows in the {len(label)} read)")
        nonfinite = first_nonfinite(dense)
        if nonfinite is not None:
            k, j, count = nonfinite
            raise LayoutError(f"{self.paths[0]}: row {self._row(sel, k)} feature {j} is {dense[k, j]} "
                              f"({count} non-finite values in the {len(dense)} rows read); dense features must be finite")
        if self.one_hot:
            block = np.asarray(self.sparse[sel])  # (n, F)
            sparse: List[object] = [block[:, f] for f in range(block.shape[1])]
        else:
            sparse = [np.asarray(a[sel]) for a in self.sparse]  # F x (n, k_f)
        return Columns(label, dense, sparse)

    @staticmethod
    def _row(sel: Union[slice, np.ndarray], k: int) -> int:
        """The day's row of the ``k``-th row read by ``sel``."""
        return int(sel.start or 0) + k if isinstance(sel, slice) else int(sel[k])


def open_day(directory: str, day: int, layout: str, num_sparse: int = 26) -> Day:
    """One day's files, mapped and checked: present, complete, 2-d, same row count everywhere."""
    paths = day_files(directory, day, layout)
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise LayoutError(f"{missing[0]}: missing ({len(missing)} of day {day}'s {layout} files are: "
                          f"{[os.path.basename(p) for p in missing]}; data.mlperf.dir = {directory})")
    dense_p, sparse_p, labels_p = paths
    dense, labels = open_npy(dense_p), open_npy(labels_p)
    if dense.ndim != 2 or not np.issubdtype(dense.dtype, np.floating):
        raise LayoutError(f"{dense_p}: expected a float (n, D) array, found {dense.dtype} {dense.shape}")
    if labels.ndim not in (1, 2) or (labels.ndim == 2 and labels.shape[1] != 1) or labels.dtype.kind not in "biuf":
        raise LayoutError(f"{labels_p}: expected numeric labels (n,) or (n, 1), found {labels.dtype} {labels.shape}")
    sparse: Union[np.ndarray, List[np.ndarray]]
    if layout == "one_hot":
        sparse = open_npy(sparse_p)
        arrays = [(sparse_p, sparse)]
    else:
        sparse = open_npz(sparse_p, [str(f) for f in range(num_sparse)])
        arrays = [(f"{sparse_p}[{f}.npy]", a) for f, a in enumerate(sparse)]
    for where, a in arrays:
        if a.ndim != 2 or a.dtype.kind not in "iu":
            raise LayoutError(f"{where}: expected integer ids (n, k), found {a.dtype} {a.shape}")
    n = dense.shape[0]
    if labels.shape[0] != n or any(a.shape[0] != n for _, a in arrays):
        where, a = next(((w, a) for w, a in arrays if a.shape[0] != n), arrays[0])  # the odd sparse array
        raise LayoutError(f"day {day}: row counts differ: {dense_p} has {n} rows, {where} has {a.shape[0]}, "
                          f"{labels_p} has {labels.shape[0]}")
    return Day(day, paths, dense, sparse, labels)


def open_days(directory: str, days: Sequence[int], layout: str, num_sparse: int = 26) -> Dict[int, Day]:
    """Every listed day (each once); the first missing file of any day is named with the count missing."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {list(LAYOUTS)}")
    if not os.path.isdir(directory):
        raise LayoutError(f"{directory}: no such directory (data.mlperf.dir)")
    wanted = list(dict.fromkeys(days))
    missing = [p for d in wanted for p in day_files(directory, d, layout) if not os.path.isfile(p)]
    if missing:
        raise LayoutError(f"{missing[0]}: missing, with {len(missing) - 1} other file(s) of days {wanted} "
                          f"({layout} layout in {directory})")
    return {d: open_day(directory, d, layout, num_sparse) for d in wanted}


@dataclass(frozen=True)
class Segment:
    """Rows ``[begin, end)`` of one day: a piece of a split."""

    day: Day
    begin: int
    end: int

    @property
    def rows(self) -> int:
        return self.end - self.begin


def split_segments(days: Dict[int, Day], split: str, train_days: Sequence[int] = (),
                   eval_day: Optional[int] = None) -> List[Segment]:
    """``train``: the train days in order; ``validation`` / ``test``: the first ``ceil(n / 2)`` / the
    remaining rows of the eval day (the reference's ``len // 2 + len % 2``)."""
    if split == "train":
        return [Segment(days[d], 0, days[d].rows) for d in train_days]
    if split not in ("validation", "test") or eval_day is None:
        raise ValueError(f"split {split!r} (train, validation or test; the last two need an eval day)")
    day = days[eval_day]
    half = day.rows // 2 + day.rows % 2
    return [Segment(day, 0, half) if split == "validation" else Segment(day, half, day.rows)]


# ----------------------------------------------------------------------------- checks
def check_shapes(days: Dict[int, Day], bag_sizes: Optional[Sequence[int]], num_dense: Optional[int] = None) -> int:
    """Same dense width on every day (``num_dense`` when given); bag widths equal to ``bag_sizes``
    (``data.mlperf.multi_hot_sizes``; one_hot: one id each). Returns the dense width D."""
    first = next(iter(days.values()))
    D = num_dense if num_dense is not None else first.dense.shape[1]
    for day in days.values():
        if day.dense.shape[1] != D:
            raise LayoutError(f"{day.paths[0]}: {day.dense.shape[1]} dense features, expected {D}"
                              f" (as {first.paths[0]})")
        widths = day.bag_sizes
        if bag_sizes is None:
            continue
        if len(widths) != len(bag_sizes):
            raise LayoutError(f"{day.paths[1]}: {len(widths)} sparse features, data.mlperf.multi_hot_sizes "
                              f"has {len(bag_sizes)}")
        for f, (k, want) in enumerate(zip(widths, bag_sizes)):
            if k != want:
                raise LayoutError(f"{day.paths[1]}[{f}.npy]: bags of {k} ids, "
                                  f"data.mlperf.multi_hot_sizes[{f}] = {want}")
    return D


def scan_ids(days: Sequence[Day], num_rows: Sequence[int], names: Sequence[str], max_rows: Optional[int],
             chunk_ids: int = 1 << 24) -> Optional[str]:
    """The first id outside ``[0, num_rows[f])`` in the first ``max_rows`` rows (None: all) of each
    day, as a message naming the file, feature, table, row, id and num_rows; None if every id fits.

    Cost: it reads the scanned rows' ids once, ``chunk_ids`` ids (64 MiB of int32) at a time. The
    full MLPerf multi-hot set is about 3.6 TB of ids (4.2 G samples x 214): scan heads, not all."""
    for day in days:
        n = day.rows if max_rows is None else min(day.rows, max_rows)
        arrays = [(day.paths[1], day.sparse, None)] if day.one_hot else \
            [(f"{day.paths[1]}[{f}.npy]", a, f) for f, a in enumerate(day.sparse)]
        for where, a, feat in arrays:
            limit = np.asarray(num_rows if feat is None else [num_rows[feat]], np.int64)  # (F,) or (1,)
            step = max(1, chunk_ids // a.shape[1])
            for i in range(0, n, step):
                block = np.asarray(a[i:min(n, i + step)])  # (c, F) or (c, k)
                bad = (block < 0) | (block >= limit)
                if bad.any():
                    r, c = divmod(int(np.flatnonzero(bad)[0]), block.shape[1])
                    f = c if feat is None else feat
                    return (f"{where}: row {i + r}: feature {f} ({names[f]}) has id {int(block[r, c])}, outside "
                            f"[0, num_rows = {num_rows[f]}) of its table; fold ids with data.mlperf.fold_ids: true "
                            "(the reference folds one-hot ids modulo the table sizes)")
    return None


def read_layout_meta(directory: str) -> Optional[Dict[str, Any]]:
    """``neo_layout.json`` of a directory written by ``neo-data mlperf-layout`` (None: absent)."""
    path = os.path.join(directory, META_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- loader
class MlperfLoader(ParquetLoader):
    """Batches of one split (a list of :class:`Segment`) as :class:`data_pipeline.loader.Batch`.

    Order: the split's ``N`` samples in day order; with ``shuffle``, windows of ``shuffle_window``
    samples each permuted by ``default_rng([seed, epoch, window])`` (the Parquet loader's rule,
    without its ramp of small first windows: nothing here waits for a window's read, the day
    files are memory-mapped; ``first_window`` is ignored).
    Sharding is the reference's: the order is cut into global batches of ``W·B`` samples and rank
    ``r`` takes samples ``[r·B, (r+1)·B)`` of each, so W ranks see, batch for batch, what one
    process sees with batches of ``W·B`` (and at W = 1 the batches equal ``ParquetLoader``'s).
    The last partial global batch is split contiguously among the ranks (dropped with
    ``drop_last``). ``position`` counts this rank's samples; from position ``p`` a rank resumes at
    global sample ``p·W`` (exact whenever ``p`` is a multiple of B, e.g. any same-W resume).

    Inherited from :class:`ParquetLoader`: the prefetch thread and epoch roll-over (``__iter__``),
    ``state_dict`` / ``load_state_dict`` / ``set_epoch`` / ``len``, and ``_to_batch``; this class
    supplies the batches' samples (``_batches``). Ids are folded modulo ``fold_rows`` when given."""

    def __init__(self, segments: Sequence[Segment], options: Optional[LoaderOptions] = None,
                 fold_rows: Optional[Sequence[int]] = None) -> None:
        o = options or LoaderOptions()
        o.check()
        if not segments:
            raise ValueError("no segments")
        self.options, self.segments = o, list(segments)
        day = segments[0].day
        F = len(day.bag_sizes)
        self.fold = None if fold_rows is None else [int(r) for r in fold_rows]
        self.meta = DatasetMeta(num_dense=int(day.dense.shape[1]), sparse_names=sparse_names(F), source="mlperf",
                                table_sizes=self.fold, multi_hot_sizes=None if day.one_hot else day.bag_sizes,
                                extra={"days": [s.day.number for s in segments]})
        self.files = [p for s in segments for p in s.day.paths]
        self._start = np.cumsum([0] + [s.rows for s in segments])  # global index of each segment's first row
        N, W, B = int(self._start[-1]), o.world_size, o.batch_size
        self.num_samples = N
        full, R = N // (W * B), N % (W * B)
        tail = 0 if o.drop_last else (o.rank + 1) * R // W - o.rank * R // W
        self.shard_begin, self.shard_end = 0, full * B + tail  # only shard_size is meaningful here
        self.epoch = self.position = 0
        self.pin = torch.cuda.is_available() if o.pin_memory is None else o.pin_memory
        self._const: Dict[Tuple[int, str], torch.Tensor] = {}
        self._perm: Dict[Tuple[int, int], np.ndarray] = {}
        self._base_nice = thread_nice()      # the background threads stand below the building thread

    def _spans(self, start: int) -> List[Tuple[int, int]]:
        """Epoch-order positions [a, b) of this rank's batches from its position ``start`` on."""
        o, N = self.options, self.num_samples
        W, B, r = o.world_size, o.batch_size, o.rank
        S = min(N, start * W)
        full, R = (N - S) // (W * B), (N - S) % (W * B)
        out = [(S + g * W * B + r * B, S + g * W * B + (r + 1) * B) for g in range(full)]
        a0 = S + full * W * B
        if R and not o.drop_last and (r + 1) * R // W > r * R // W:
            out.append((a0 + r * R // W, a0 + (r + 1) * R // W))
        return out

    def _order(self, epoch: int, a: int, b: int) -> Union[slice, np.ndarray]:
        """Global sample indices at epoch-order positions [a, b): a slice unless shuffled."""
        o = self.options
        if not o.shuffle:
            return slice(a, b)
        win, parts = o.shuffle_window, []
        for k in range(a // win, (b - 1) // win + 1):
            if (epoch, k) not in self._perm:
                if len(self._perm) > 2:
                    self._perm.pop(next(iter(self._perm)))
                size = min(self.num_samples, (k + 1) * win) - k * win
                self._perm[(epoch, k)] = k * win + np.random.default_rng([o.seed, epoch, k]).permutation(size)
            lo = max(a, k * win) - k * win
            parts.append(self._perm[(epoch, k)][lo:min(b, (k + 1) * win) - k * win])
        return np.concatenate(parts)

    def _read(self, sel: Union[slice, np.ndarray]) -> Columns:
        """Samples ``sel`` (global indices) from the segments, in ``sel``'s order."""
        if isinstance(sel, slice):
            idx, order = None, None
            bounds = [(max(sel.start, int(s0)), min(sel.stop, int(s1))) for s0, s1 in zip(self._start, self._start[1:])]
        else:
            order = np.argsort(sel, kind="stable")
            idx = sel[order]  # increasing
            cut = np.searchsorted(idx, self._start)
            bounds = list(zip(cut, cut[1:]))
        parts = []
        for k, (i, j) in enumerate(bounds):
            if i >= j:
                continue
            seg, s0 = self.segments[k], int(self._start[k])
            rows = slice(seg.begin + i - s0, seg.begin + j - s0) if idx is None else seg.begin + idx[i:j] - s0
            parts.append(seg.day.read(rows))
        cols = Columns.concat(parts)
        if order is not None:
            inv = np.empty_like(order)
            inv[order] = np.arange(len(order))
            cols = take_rows(cols, inv)
        if self.fold is None and self.options.id_limits is not None:
            bad = first_id_out_of_range(cols.sparse, self.options.id_limits)
            if bad is not None:
                f, r, value = bad
                g = (sel.start + r) if isinstance(sel, slice) else int(sel[r])          # its global index
                k = int(np.searchsorted(self._start, g, side="right")) - 1
                seg = self.segments[k]
                row = seg.begin + g - int(self._start[k])                            # its row in the day
                path = seg.day.paths[1] if seg.day.one_hot else f"{seg.day.paths[1]}[{f}.npy]"   # as scan_ids
                raise self.options.id_error(path, self.meta.sparse_names, (f, row, value)) from None
        if self.fold is not None:
            cols.sparse = [np.asarray(s, np.int64) % rows for s, rows in zip(cols.sparse, self.fold)]
        return cols

    def _ramp_first(self) -> None:
        """No ramp (module docstring): the windows are all ``shuffle_window``, whatever ``first_window`` says."""
        return None

    def warm_up(self) -> None:
        """Nothing to start: the day files are memory-mapped and each batch reads its own rows."""

    def _batches(self, epoch: int, start: int) -> Iterator[Tuple[Batch, int]]:
        spans = self._spans(start)
        pos = start
        for n, (a, b) in enumerate(spans):
            pos = self.shard_size if n == len(spans) - 1 else pos + (b - a)
            yield self._to_batch(self._read(self._order(epoch, a, b))), pos
