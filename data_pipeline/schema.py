"""Parquet layout shared by every writer (Criteo, synthetic, multi-hot) and the loader.

One row per sample::

    label      int8                         0 or 1
    dense      fixed_size_list<float32>[D]  D dense features (13 for Criteo), already transformed
    cat_0 ...  int64                        one-hot: one id per sample and table
    cat_{F-1}  or fixed_size_list<int64>[k] multi-hot with a fixed bag size k (MLPerf multi-hot)
               or list<int64>               multi-hot with variable bag sizes (synthetic)

The file-level key-value metadata ``neo.data`` holds a JSON object (:class:`DatasetMeta`)
with the counts, names, table sizes and the producer's extra information (for synthetic
data: the teacher's best achievable AUC).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import pyarrow as pa

__all__ = [
    "META_KEY",
    "FORMAT_VERSION",
    "CRITEO_NUM_DENSE",
    "CRITEO_NUM_SPARSE",
    "MLPERF_TABLE_SIZES",
    "MLPERF_MULTI_HOT_SIZES",
    "DatasetMeta",
    "sparse_names",
    "arrow_schema",
    "read_meta",
    "check_columns",
    "check_same_layout",
    "DataFileError",
]

META_KEY = b"neo.data"
FORMAT_VERSION = 1
CRITEO_NUM_DENSE = 13
CRITEO_NUM_SPARSE = 26

#: Rows of the 26 embedding tables in MLPerf DLRM-DCNv2 (Criteo 1TB, ids folded modulo these).
MLPERF_TABLE_SIZES: List[int] = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
]
#: Ids per bag of the 26 features in the MLPerf DLRM-DCNv2 multi-hot data set.
MLPERF_MULTI_HOT_SIZES: List[int] = [
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
]


class DataFileError(ValueError):
    """A data file that is not what the layout promises (not Parquet, a column missing or of the
    wrong type or width, bad values): the message names the file (where known) and the column."""


def sparse_names(num_sparse: int) -> List[str]:
    """Column names of the sparse features: ``cat_0 .. cat_{F-1}``."""
    return [f"cat_{i}" for i in range(num_sparse)]


@dataclass
class DatasetMeta:
    """What a data set's Parquet files say about themselves (stored as JSON under ``neo.data``)."""

    num_dense: int
    """D, the length of the ``dense`` list column."""
    sparse_names: List[str]
    """Names of the sparse columns, in layout order (F of them)."""
    source: str
    """Producer: ``criteo``, ``synthetic`` or ``multihot``."""
    table_sizes: Optional[List[int]] = None
    """Rows of each embedding table (ids are < this), when known."""
    multi_hot_sizes: Optional[List[int]] = None
    """Fixed bag size per feature; None for one-hot or variable-size bags."""
    extra: Dict[str, Any] = field(default_factory=dict)
    """Producer-specific information (transform, split, teacher AUC, ...)."""
    format_version: int = FORMAT_VERSION
    """Layout version of this module."""

    @property
    def num_sparse(self) -> int:
        return len(self.sparse_names)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "DatasetMeta":
        obj = json.loads(text)
        return cls(**obj)


def arrow_schema(meta: DatasetMeta, sparse_kind: str = "onehot") -> pa.Schema:
    """Arrow schema of a data set; ``sparse_kind``: ``onehot``, ``fixed`` (needs multi_hot_sizes) or ``list``."""
    fields = [pa.field("label", pa.int8(), nullable=False),
              pa.field("dense", pa.list_(pa.float32(), meta.num_dense), nullable=False)]
    for i, name in enumerate(meta.sparse_names):
        if sparse_kind == "onehot":
            t = pa.int64()
        elif sparse_kind == "fixed":
            assert meta.multi_hot_sizes is not None, "fixed multi-hot needs multi_hot_sizes"
            t = pa.list_(pa.int64(), meta.multi_hot_sizes[i])
        elif sparse_kind == "list":
            t = pa.list_(pa.int64())
        else:
            raise ValueError(f"unknown sparse_kind {sparse_kind!r}")
        fields.append(pa.field(name, t, nullable=False))
    return pa.schema(fields, metadata={META_KEY: meta.to_json().encode()})


def read_meta(schema: pa.Schema, path: str = "?") -> DatasetMeta:
    """The :class:`DatasetMeta` of a Parquet file's Arrow schema; a clear error if it is not ours."""
    md = schema.metadata or {}
    if META_KEY not in md:
        raise DataFileError(f"{path}: no '{META_KEY.decode()}' metadata; not written by data_pipeline")
    try:
        meta = DatasetMeta.from_json(md[META_KEY])
    except (ValueError, TypeError) as exc:
        raise DataFileError(f"{path}: unreadable '{META_KEY.decode()}' metadata: {exc}") from None
    if meta.format_version != FORMAT_VERSION:
        raise DataFileError(f"{path}: layout version {meta.format_version}, this code reads {FORMAT_VERSION}")
    check_columns(schema, meta, path)
    return meta


def _value_type(t: pa.DataType) -> Optional[pa.DataType]:
    """The value type of a list column (fixed-size, variable or large), None for a flat column."""
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        return t.value_type
    return None


def check_columns(schema: pa.Schema, meta: DatasetMeta, path: str = "?") -> None:
    """Every column the metadata promises is there with a type the reader takes: label (integer or
    float), dense (a list of floats, of width D where the width is fixed), each sparse column
    (integer ids, flat or in lists). From the footer only, so that the loader finds a file that
    does not fit when it is built (it reads every file's schema), not as a KeyError mid-training."""
    names = set(schema.names)
    for name in ["label", "dense"] + list(meta.sparse_names):
        if name not in names:
            raise DataFileError(f"{path}: column {name!r} is missing (the metadata lists it; "
                                f"the file has {schema.names})")
    lt = schema.field("label").type
    if not (pa.types.is_integer(lt) or pa.types.is_floating(lt)):
        raise DataFileError(f"{path}: column 'label' has type {lt}, expected integers (0 or 1)")
    dt = schema.field("dense").type
    if _value_type(dt) is None or not pa.types.is_floating(_value_type(dt)):
        raise DataFileError(f"{path}: column 'dense' has type {dt}, expected a list of {meta.num_dense} floats")
    if pa.types.is_fixed_size_list(dt) and dt.list_size != meta.num_dense:
        raise DataFileError(f"{path}: column 'dense' holds {dt.list_size} values per row, the metadata "
                            f"says num_dense = {meta.num_dense}")
    for name in meta.sparse_names:
        t = schema.field(name).type
        ids = _value_type(t) or t
        if not pa.types.is_integer(ids):
            raise DataFileError(f"{path}: column {name!r} has type {t}, expected integer ids (or lists of them)")


def _column_kind(t: pa.DataType) -> str:
    """How a column holds its values, as the reader distinguishes them: flat, a fixed-size list of
    k, or a variable-size list (the integer or float width aside: the reader converts those)."""
    if pa.types.is_fixed_size_list(t):
        return f"fixed-size lists of {t.list_size}"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "variable-size lists"
    return "one value per row"


def check_same_layout(schema: pa.Schema, meta: DatasetMeta, path: str, ref_schema: pa.Schema,
                      ref_meta: DatasetMeta, ref_path: str, column_kinds: bool = True) -> None:
    """File ``path`` holds the same layout as ``ref_path``: the same dense width, the same sparse
    columns in the same order and, with ``column_kinds`` (files one reader reads as one stream,
    e.g. the files of a split), each sparse column holding its ids the same way (flat, fixed-size
    lists of the same size, or variable-size lists: a reader takes one way per column). The
    validation split against the training one is checked without: each split has its own loader.
    A :class:`DataFileError` naming both files and the first difference."""
    def differ(what: str) -> DataFileError:
        return DataFileError(f"{path}: {what}, unlike {ref_path}; the files of a data set must share one layout")

    if meta.num_dense != ref_meta.num_dense:
        raise differ(f"num_dense is {meta.num_dense} (metadata), not {ref_meta.num_dense}")
    if meta.sparse_names != ref_meta.sparse_names:
        mine, ref = meta.sparse_names, ref_meta.sparse_names
        if len(mine) != len(ref):
            raise differ(f"{len(mine)} sparse columns, not {len(ref)}")
        i = next(i for i, (a, b) in enumerate(zip(mine, ref)) if a != b)
        raise differ(f"sparse column {i} is {mine[i]!r}, not {ref[i]!r}")
    for name in meta.sparse_names if column_kinds else ():    # dense: the reader takes either list kind
        kind, ref_kind = _column_kind(schema.field(name).type), _column_kind(ref_schema.field(name).type)
        if kind != ref_kind:
            raise differ(f"column {name!r} holds {kind}, not {ref_kind}")
