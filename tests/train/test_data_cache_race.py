"""The synthetic data cache's staging copy (``synth-<hash>.tmp-<pid>``): removed when generation
fails or is interrupted, and discarded when another process finished the same set first."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import data_pipeline.synthetic
from neo.train.build import resolve_tables
from neo.train.data import _generate, synthetic_dir
from tests.train.test_trainer import tiny_config


def _staged(cache: str) -> list:
    """The staging copies left in ``cache``."""
    return [n for n in os.listdir(cache) if ".tmp-" in n]


def test_a_lost_race_uses_the_winners_set_and_leaves_no_copy(tmp_path, monkeypatch):
    """Another process renames its finished set into place while this one generates: this one's
    rename finds ``out`` complete (not empty: ENOTEMPTY), keeps theirs and removes its own copy."""
    cfg = tiny_config(str(tmp_path))
    tables = resolve_tables(cfg)
    out = synthetic_dir(cfg, tables)
    os.makedirs(os.path.dirname(out))
    real = data_pipeline.synthetic.generate

    def generate_and_lose(o, *args, **kwargs):
        summary = real(o, *args, **kwargs)
        shutil.copytree(o.output, out)                   # the winner: the same set, renamed first
        with open(os.path.join(out, "winner"), "w"):
            pass
        return summary

    monkeypatch.setattr(data_pipeline.synthetic, "generate", generate_and_lose)
    _generate(cfg, tables, out, log=lambda *a: None)
    assert os.path.exists(os.path.join(out, "winner"))
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["rows_written"] == 10240
    assert _staged(os.path.dirname(out)) == []


def test_a_rename_onto_an_unfinished_set_still_fails(tmp_path, monkeypatch):
    """``out`` exists but has no summary (not a finished set): the error is raised, the copy removed."""
    cfg = tiny_config(str(tmp_path))
    tables = resolve_tables(cfg)
    out = synthetic_dir(cfg, tables)
    os.makedirs(os.path.join(out, "train"))
    with open(os.path.join(out, "train", "part"), "w"):
        pass

    def fake(o, *args, **kwargs):
        os.makedirs(os.path.join(o.output, "train"))
        with open(os.path.join(o.output, "summary.json"), "w") as f:
            json.dump({}, f)

    monkeypatch.setattr(data_pipeline.synthetic, "generate", fake)
    with pytest.raises(OSError):
        _generate(cfg, tables, out, log=lambda *a: None)
    assert _staged(os.path.dirname(out)) == []


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failure_mid_generation_leaves_no_copy(tmp_path, monkeypatch, error):
    """Generation stops half way (an error, Ctrl-C): the partial staging copy is removed, the error raised."""
    cfg = tiny_config(str(tmp_path))
    tables = resolve_tables(cfg)
    out = synthetic_dir(cfg, tables)
    os.makedirs(os.path.dirname(out))

    def half_way(o, *args, **kwargs):
        os.makedirs(os.path.join(o.output, "train"))
        with open(os.path.join(o.output, "train", "part-0.parquet"), "wb") as f:
            f.write(b"x" * 1024)
        raise error

    monkeypatch.setattr(data_pipeline.synthetic, "generate", half_way)
    with pytest.raises(type(error)):
        _generate(cfg, tables, out, log=lambda *a: None)
    assert _staged(os.path.dirname(out)) == []
    assert not os.path.exists(out)
