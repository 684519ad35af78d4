"""Synthetic click data with a planted teacher model, streamed to Parquet.

Samples are generated in fixed blocks of :data:`GEN_BLOCK` rows; block ``b`` draws everything
from ``numpy.random.default_rng([seed, 1, b])``, so the data depend only on the seed and the
options, never on the worker count or how the output is cut into files.

Teacher (drawn from ``default_rng([seed, 0])``)::

    score = dense @ w_dense + sum_t w_t * mean_{id in bag t} h_t(id) + bias
    p     = sigmoid(score);   label ~ Bernoulli(p)

``h_t(id)`` is a hash of (seed, table, id) mapped to a uniform value of unit variance, so a
table of any size needs no memory. The best achievable AUC (that of the true ``p`` on the drawn
labels) is computed exactly on the first ``auc_samples`` samples and reported.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .locality import (coprime_multiplier, fit_mixture, reuse_histogram, target_histogram, total_variation,
                       zipf_ranks)
from .parallel import ordered_map
from .schema import MLPERF_TABLE_SIZES, DatasetMeta, sparse_names
from .synth_knobs import SynthKnobs
from .writer import Columns, ShardWriter, WriterOptions, check_output_dir, write_json_replacing

__all__ = ["GEN_BLOCK", "SynthKnobs", "SynthOptions", "generate_block", "generate", "auc", "apply_preset", "PRESETS"]

GEN_BLOCK = 65536
PRESETS = ("criteo", "production-2021", "production-2022")


@dataclass(kw_only=True)
class SynthOptions(SynthKnobs):
    """Options of ``neo-data synth`` (keyword arguments only)."""

    num_samples: int
    """Samples to generate."""
    output: str = ""
    """Output directory: ``<output>/train/part-*.parquet`` and ``<output>/summary.json``."""
    table_rows: List[int] = field(default_factory=lambda: [100000] * 26)
    """Rows of each embedding table (ids are in [0, rows)); one entry per sparse feature."""
    auc_samples: int = 1_000_000
    """The best AUC is computed exactly on the first this many samples."""
    workers: int = 2
    """Generator threads or processes (does not change the data)."""
    executor: str = "thread"
    """``thread`` or ``process``."""
    preset: Optional[str] = None
    """Name of the preset applied (see :func:`apply_preset`); informational once applied."""
    locality: Optional[Dict[str, Any]] = None
    """Fit report of a production-locality preset (filled by :func:`apply_preset`)."""
    writer: WriterOptions = field(default_factory=WriterOptions)
    """Parquet sharding and codec."""

    def per_table(self, values: List[Any], name: str) -> List[Any]:
        if len(values) == 1:
            return list(values) * len(self.table_rows)
        if len(values) != len(self.table_rows):
            raise ValueError(f"{name}: give 1 or {len(self.table_rows)} values, got {len(values)}")
        return list(values)


def apply_preset(opts: SynthOptions, name: str, stats_path: Optional[str] = None, num_tables: int = 26,
                 fit_lookups: Optional[int] = None) -> SynthOptions:
    """Set the table configuration of a preset.

    * ``criteo``: 13 dense, 26 one-hot tables of the MLPerf (Criteo 1TB) sizes, Zipf skew 1.05.
    * ``production-2021`` / ``production-2022``: 13 dense, ``num_tables`` one-hot tables whose
      (rows, skew) are a mixture fitted so that the per-batch reuse histogram of the lookups,
      over batches of the stats file's batch size (65,536 / 131,072), matches the production
      histogram of ``stats_path`` (``dlrm_datasets_20xx_locality_stats.txt``).
      ``fit_lookups`` (default: that batch size) sets the simulated lookups per table and batch.
    """
    if name == "criteo":
        opts.num_dense, opts.table_rows = 13, list(MLPERF_TABLE_SIZES)
        opts.ids_per_bag, opts.distribution, opts.skew = [1], "zipf", [1.05]
    elif name in ("production-2021", "production-2022"):
        if stats_path is None:
            raise ValueError(f"preset {name} needs the locality stats file (--locality-stats)")
        target, sec = target_histogram(stats_path)
        lookups = fit_lookups or sec.batch_size
        mix = fit_mixture(target, lookups, num_tables, seed=opts.seed)
        opts.num_dense = 13
        opts.table_rows = [r for r, _ in mix.tables]
        opts.skew = [s for _, s in mix.tables]
        opts.ids_per_bag, opts.distribution = [1], "zipf"
        opts.locality = dict(mix.to_dict(), stats_file=os.path.basename(stats_path), section=sec.name,
                             batch_size=sec.batch_size)
    else:
        raise ValueError(f"unknown preset {name!r}; have {PRESETS}")
    opts.preset = name
    return opts


# ----------------------------------------------------------------------------- teacher
def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def id_weight(salt: int, ids: np.ndarray) -> np.ndarray:
    """Teacher weight of every id (float64, uniform on [-sqrt 3, sqrt 3]: unit variance)."""
    with np.errstate(over="ignore"):
        x = _splitmix64(ids.astype(np.uint64) ^ np.uint64(salt))
    u = (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return (2.0 * u - 1.0) * math.sqrt(3.0)


@dataclass
class _Teacher:
    w_dense: np.ndarray  # (D,)
    w_sparse: np.ndarray  # (F,)
    salts: List[int]
    perm_a: List[int]  # id = (rank * a + c) % rows, gcd(a, rows) = 1
    perm_c: List[int]
    bias: float


def _teacher(o: SynthOptions) -> _Teacher:
    rng = np.random.default_rng([o.seed, 0])
    F, D = len(o.table_rows), o.num_dense
    w_dense = rng.standard_normal(D) * (o.dense_strength / math.sqrt(max(D, 1)))
    w_sparse = rng.standard_normal(F) * (o.sparse_strength / math.sqrt(max(F, 1)))
    salts = [int(s) for s in rng.integers(0, 2**63 - 1, F)]
    perm_a, perm_c = [], []
    for rows in o.table_rows:
        a = coprime_multiplier(rows, int(rng.integers(rows // 3 + 1, rows + 1))) if rows > 2 else 1
        perm_a.append(a % rows if rows > 1 else 1)
        perm_c.append(int(rng.integers(0, rows)))
    bias = math.log(o.base_ctr / (1 - o.base_ctr))
    return _Teacher(w_dense, w_sparse, salts, perm_a, perm_c, bias)


# ----------------------------------------------------------------------------- generation
def generate_block(o: SynthOptions, teacher: _Teacher, b: int) -> Tuple[Columns, np.ndarray]:
    """Rows [b * GEN_BLOCK, min(N, (b + 1) * GEN_BLOCK)) and their true click probabilities (n,)."""
    n = min(o.num_samples, (b + 1) * GEN_BLOCK) - b * GEN_BLOCK
    rng = np.random.default_rng([o.seed, 1, b])
    dense = rng.standard_normal((n, o.num_dense), dtype=np.float32)  # (n, D)
    score = dense.astype(np.float64) @ teacher.w_dense + teacher.bias  # (n,)
    ks = o.per_table(o.ids_per_bag, "ids_per_bag")
    skews = o.per_table(o.skew, "skew")
    sparse: List[object] = []
    for t, rows in enumerate(o.table_rows):
        k = ks[t]
        lens = rng.integers(0, 2 * k + 1, n) if o.variable_bags else np.full(n, k, np.int64)  # (n,)
        nnz = int(lens.sum())
        if o.distribution == "uniform" or skews[t] == 0:
            ranks = rng.integers(0, rows, nnz)
        elif o.distribution == "zipf":
            ranks = zipf_ranks(rng, nnz, rows, float(skews[t]))
        else:
            raise ValueError(f"unknown distribution {o.distribution!r} (uniform or zipf)")
        ids = (ranks * teacher.perm_a[t] + teacher.perm_c[t]) % rows  # (nnz,)
        w = id_weight(teacher.salts[t], ids)
        if o.variable_bags:
            row = np.repeat(np.arange(n), lens)
            bag = np.bincount(row, weights=w, minlength=n) / np.maximum(lens, 1)
            offs = np.zeros(n + 1, np.int64)
            np.cumsum(lens, out=offs[1:])
            sparse.append((ids, offs))
        elif k == 1:
            bag = w
            sparse.append(ids)
        else:
            bag = w.reshape(n, k).mean(axis=1)
            sparse.append(ids.reshape(n, k))
        score += teacher.w_sparse[t] * bag
    p = 1.0 / (1.0 + np.exp(-score))
    label = (rng.random(n) < p).astype(np.int8)
    return Columns(label, dense, sparse), p


_GEN_STATE: Dict[str, Any] = {}  # per process: options and teacher (set by _init), read-only


def _init(o: SynthOptions) -> None:
    _GEN_STATE["o"], _GEN_STATE["t"] = o, _teacher(o)


def _gen(b: int) -> Tuple[Columns, np.ndarray]:
    return generate_block(_GEN_STATE["o"], _GEN_STATE["t"], b)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (Mann-Whitney, ties counted half)."""
    labels = np.asarray(labels).astype(bool)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = np.asarray(scores)[order]
    ranks = np.empty(len(s), np.float64)
    starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
    ends = np.concatenate([starts[1:], [len(s)]])
    avg = (starts + ends + 1) / 2.0  # average 1-based rank of each tie group
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def _check_options(o: SynthOptions) -> None:
    """Bad options as one clear error before any work (not an error deep in a generator thread)."""
    if o.num_samples < 0:
        raise ValueError("num_samples must be >= 0")
    if not o.table_rows or min(o.table_rows) < 1:
        raise ValueError(f"table_rows must be >= 1 each (one per table), got {o.table_rows}")
    if min(o.per_table(o.ids_per_bag, "ids_per_bag")) < 1:
        raise ValueError(f"ids_per_bag must be >= 1, got {o.ids_per_bag}")
    if min(o.per_table(o.skew, "skew")) < 0:
        raise ValueError(f"skew must be >= 0, got {o.skew}")


def generate(o: SynthOptions, progress_factory: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Generate ``o.num_samples`` samples into ``o.output``; returns the summary (also in summary.json).

    ``<output>/train`` is refused if it holds an earlier run's files (unless ``o.writer.overwrite``);
    the shards are staged and appear, with the summary, only when generation succeeded."""
    _check_options(o)
    check_output_dir(os.path.join(o.output, "train"), o.writer.overwrite)
    made_root = bool(o.output) and not os.path.isdir(o.output)
    writer: List[ShardWriter] = []      # the one writer, once made (a list: _generate fills it)
    try:
        summary = _generate(o, progress_factory, writer)
        writer[0].commit()
    except BaseException:
        if writer:
            writer[0].abort()
        if made_root:
            try:
                os.rmdir(o.output)
            except OSError:
                pass
        raise
    write_json_replacing(os.path.join(o.output, "summary.json"), summary)
    return summary


def _generate(o: SynthOptions, progress_factory: Optional[Callable[..., Any]], made: List[ShardWriter]
              ) -> Dict[str, Any]:
    """The generation proper; appends its writer to ``made`` as soon as it exists (for the caller's abort)."""
    t0 = time.time()
    ks = o.per_table(o.ids_per_bag, "ids_per_bag")
    kind = "list" if o.variable_bags else ("onehot" if all(k == 1 for k in ks) else "fixed")
    teacher = _teacher(o)
    nblocks = (o.num_samples + GEN_BLOCK - 1) // GEN_BLOCK
    bar = progress_factory(total=o.num_samples, unit="rows", desc="synth") if progress_factory else None
    best, kept = _best_auc_upfront(o, teacher)
    batch_ids: List[List[np.ndarray]] = [[] for _ in o.table_rows]
    loc_batch = (o.locality or {}).get("batch_size", 0)
    loc_samples = 0
    writer: Optional[ShardWriter] = None
    pos_count = 0
    results = ordered_map(_gen, ((b, b) for b in range(nblocks)), o.workers, _init, (o,), o.executor)
    for b, (cols, p) in results:
        if writer is None:
            writer = _make_writer(o, kind, best, kept)
            made.append(writer)
        writer.write(cols)
        pos_count += int(cols.label.sum())
        if loc_batch and loc_samples < loc_batch:  # the ids of the first batch, for the measured reuse
            take = min(len(cols), loc_batch - loc_samples)
            loc_samples += take
            for t in range(len(o.table_rows)):
                s = cols.sparse[t]
                batch_ids[t].append(s[0][:s[1][take]] if isinstance(s, tuple) else s[:take].reshape(-1))
        if bar is not None:
            bar.update(len(cols))
    if writer is None:
        writer = _make_writer(o, kind, best, kept)
        made.append(writer)
    files = writer.close(commit=False)
    if bar is not None:
        bar.close()
    summary: Dict[str, Any] = {
        "rows_written": writer.rows_written, "files": files, "positive_rate": pos_count / max(o.num_samples, 1),
        "best_auc": best, "auc_samples": kept, "seconds": round(time.time() - t0, 3),
        "options": asdict(o),
    }
    if o.locality is not None:
        summary["locality_fit"] = o.locality
    if o.locality is not None and batch_ids[0]:
        hs = [reuse_histogram(np.concatenate(x)) for x in batch_ids]
        agg = np.mean(hs, axis=0)  # every table has the same lookups per batch (one-hot)
        measured = total_variation(agg, np.asarray(o.locality["target"]))
        summary["locality_measured"] = {"batch_size": loc_batch, "samples_used": loc_samples,
                                        "histogram": [round(float(x), 4) for x in agg],
                                        "tv_distance": round(measured, 4)}
    return summary


def _make_writer(o: SynthOptions, kind: str, best: float, kept: int) -> ShardWriter:
    ks = o.per_table(o.ids_per_bag, "ids_per_bag")
    meta = DatasetMeta(
        num_dense=o.num_dense, sparse_names=sparse_names(len(o.table_rows)), source="synthetic",
        table_sizes=list(o.table_rows), multi_hot_sizes=None if (kind == "list" or kind == "onehot") else ks,
        extra={"seed": o.seed, "generator_block": GEN_BLOCK, "distribution": o.distribution,
               "skew": o.per_table(o.skew, "skew"), "ids_per_bag": ks, "variable_bags": o.variable_bags,
               "best_auc": best, "auc_samples": kept, "preset": o.preset, "locality": o.locality,
               "teacher": {"dense_strength": o.dense_strength, "sparse_strength": o.sparse_strength,
                           "base_ctr": o.base_ctr}})
    return ShardWriter(os.path.join(o.output, "train"), meta, kind, o.writer)


def _best_auc_upfront(o: SynthOptions, teacher: _Teacher) -> Tuple[float, int]:
    """Exact AUC of the true probabilities on the first ``auc_samples`` samples (generated once more
    here, so that the Parquet metadata, written first, can carry it)."""
    probs, labels, kept, b = [], [], 0, 0
    while kept < min(o.auc_samples, o.num_samples):
        cols, p = generate_block(o, teacher, b)
        take = min(len(p), o.auc_samples - kept)
        probs.append(p[:take])
        labels.append(cols.label[:take])
        kept += take
        b += 1
    return (auc(np.concatenate(labels), np.concatenate(probs)) if labels else float("nan")), kept
