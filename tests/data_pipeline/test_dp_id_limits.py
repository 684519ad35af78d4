"""Ids checked against their tables' rows as the loaders read (LoaderOptions.id_limits): an id
outside [0, rows) is a DataFileError naming the file, row group, row, column, id and table;
`neo train` stops on it with that one line and exit status 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from data_pipeline.loader import LoaderOptions, ParquetLoader
from data_pipeline.reader import first_id_out_of_range
from data_pipeline.schema import DataFileError
from tests.data_pipeline.test_dp_loader import N, write_indexed

OWNERS = ["table 't0'", "table 't1'", "table 't2'"]


def _epoch(directory, limits, shuffle=False):
    loader = ParquetLoader(directory, LoaderOptions(batch_size=37, shuffle=shuffle, shuffle_window=100, read_rows=90,
                                                    id_limits=limits, id_owners=OWNERS[:len(limits)]))
    return list(loader), loader.files


@pytest.mark.parametrize("shuffle", [False, True])
def test_ids_within_their_tables_pass(tmp_path, shuffle):
    write_indexed(tmp_path / "d", jagged=True)
    batches, _ = _epoch(str(tmp_path / "d"), [N, 7 * N, 10 * N], shuffle)   # the largest ids: N-1, 7(N-1), 10(N-1)+2
    assert sum(b.batch_size for b in batches) == N


@pytest.mark.parametrize("limits, column, sample, value", [
    ([N, 3500, None], "cat_1", 500, 3500),             # one-hot: sample 7 i >= 3500 first at i = 500
    ([N, 7 * N, 7000], "cat_2", 701, 7010),            # a list column: 10 i + k, bags of i % 4 ids (700's is empty)
    ([600, None, None], "cat_0", 600, 600),
])
def test_the_first_id_past_its_table_is_named_by_file_row_group_and_row(tmp_path, limits, column, sample, value):
    write_indexed(tmp_path / "d", jagged=True)                 # files of 300 rows, row groups of 64
    with pytest.raises(DataFileError) as e:
        _epoch(str(tmp_path / "d"), limits)
    files = sorted(os.path.join(tmp_path / "d", f) for f in os.listdir(tmp_path / "d") if f.endswith(".parquet"))
    f, in_file = divmod(sample, 300)
    group, row = divmod(in_file, 64)
    owner = OWNERS[int(column[-1])]
    assert str(e.value) == (f"{files[f]} row group {group}: column {column!r} row {row}: id {value} is outside "
                            f"[0, {limits[int(column[-1])]}) of {owner} (num_rows)")


def test_negative_ids_and_each_layout_against_a_scan():
    """first_id_out_of_range against a plain scan of every id, on random columns of each layout."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 20))
        onehot = rng.integers(-2, 40, n)
        fixed = rng.integers(-2, 40, (n, 3))
        lens = rng.integers(0, 4, n)
        offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        vals = rng.integers(-2, 40, int(offs[-1]))
        cols, limits = [onehot, fixed, (vals, offs)], [int(x) for x in rng.integers(30, 45, 3)]
        want = None
        for f, col in enumerate(cols):
            rows = [[int(v)] for v in col] if f == 0 else [list(map(int, r)) for r in col] if f == 1 else \
                [list(map(int, vals[offs[i]:offs[i + 1]])) for i in range(n)]
            bad = [(r, v) for r, row in enumerate(rows) for v in row if not 0 <= v < limits[f]]
            if bad:
                want = (f, bad[0][0], bad[0][1])
                break
        assert first_id_out_of_range(cols, limits) == want


def test_neo_train_stops_on_it_with_one_line(tmp_path):
    """Parquet data without table sizes in its metadata (nothing to check at setup) and a config
    whose second table is smaller than the ids its column holds: exit 2, the file and row named."""
    from tests.train.test_trainer import ROOT

    write_indexed(tmp_path / "train", n=1200, rows_per_file=600)
    write_indexed(tmp_path / "val", n=300, rows_per_file=300)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
tables:
  - {{name: a, num_rows: 1200, dim: 8}}
  - {{name: b, num_rows: 5000, dim: 8}}
model: {{interaction: dot, dense_arch: [8], over_arch: [4, 1]}}
data: {{source: parquet, train_paths: ["{tmp_path}/train"], val_paths: ["{tmp_path}/val"], shuffle: false}}
train: {{batch_size: 50, steps: 20, run_dir: "{tmp_path}/run", progress: false}}
""")
    p = subprocess.run([sys.executable, "-m", "neo.cli", "train", str(cfg)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    # sample 715 is the first with 7 i >= 5000: file 1 (rows 600..1199), its row 115, row group 1, row 51
    assert re.search(r"neo train: error: \S+part-0*1\.parquet row group 1: column 'cat_1' row 51: id 5005 is "
                     r"outside \[0, 5000\) of table 'b' \(num_rows\)", p.stderr), p.stderr[-3000:]


def _config(tmp_path) -> dict:
    return {"tables": [{"name": "a", "num_rows": 1200, "dim": 8}, {"name": "b", "num_rows": 5000, "dim": 8}],
            "model": {"interaction": "dot", "dense_arch": [8], "over_arch": [4, 1]},
            "data": {"source": "parquet", "train_paths": [f"{tmp_path}/train"], "val_paths": [f"{tmp_path}/val"],
                     "shuffle": False},
            "train": {"batch_size": 25, "steps": 20, "run_dir": f"{tmp_path}/run", "progress": False}}


def _neo_train(rank: int, world_size: int, config: dict):
    import contextlib
    import io

    from neo.commands.train import run
    from neo.config import config_from_dict

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = run(config_from_dict(config))
    return status, err.getvalue()


def test_at_two_ranks_the_rank_that_reads_it_names_it_and_the_other_names_that_rank(tmp_path):
    """Rank 1's shard (samples 600..1199) holds the bad id: rank 1 exits 2 with the file and row;
    rank 0, left waiting in a collective, stops with one line naming rank 1 (no traceback)."""
    from tests.multiprocess import run_multiprocess

    write_indexed(tmp_path / "train", n=1200, rows_per_file=600)
    write_indexed(tmp_path / "val", n=300, rows_per_file=300)
    (s0, e0), (s1, e1) = run_multiprocess(_neo_train, 2, _config(tmp_path))
    assert s1 == 2 and "Traceback" not in e1, e1
    assert re.search(r"neo train: error: \S+part-0*1\.parquet row group 1: column 'cat_1' row 51: id 5005", e1), e1
    assert s0 == 1 and "Traceback" not in e0, e0
    assert re.search(r"neo train: error: rank 0: step \d+: .* stopped: rank 0: .*rank\(s\) 1 \(pid \d+\) exited; "
                     r"that rank's own error says why", e0), e0
