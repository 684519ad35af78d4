"""Checkpoints through torch.distributed.checkpoint: DCP's own tools read them, background
saves are consistent snapshots, the earlier format still loads, damaged checkpoints are
detected and the newest intact one is resumed from."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from neo.train.checkpoint.dcp_state import parse_band
from tests.multiprocess import run_multiprocess
from tests.train.test_checkpoint import _load_into
from tests.train.test_trainer import MIXED, ROOT, TINY, tiny_config, train_and_collect

ADAGRAD_ITEM = ["tables.1.optimizer.type=adagrad"]       # item column-wise with per-element state


def test_dcp_tools_convert_the_checkpoint_to_full_tables(tmp_data):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ck = f"{tmp_data}/tools"
    saved = run_multiprocess(train_and_collect, 2, tmp_data, ["train.steps=10", f"train.checkpoint_dir={ck}"] + MIXED)[0]
    out = f"{tmp_data}/tools.pt"
    dcp_to_torch_save(f"{ck}/step-10", out)                # DCP's converter, no Neo code involved
    full = torch.load(out, weights_only=False)
    for name, w in saved["weights"].items():
        assert torch.equal(full["embedding"][name]["weight"], w), name
        for state, v in saved["states"][name].items():
            table = full["embedding"][name]
            if state not in table:   # per-row state of a column-split table: one key per column band
                bands = sorted((parse_band(f"{state}@{k.split('@', 1)[1]}"), k) for k in table if k.startswith(f"{state}@"))
                assert bands and bands[0][0][1] == 0, (name, state, list(table))
                state = bands[0][1]  # full_optimizer_state reports the band at column 0
            assert torch.equal(table[state].float(), v), (name, state)
    for k, v in saved["dense"].items():
        assert torch.equal(full["dense"]["model"][k], v), k
    meta = json.loads(full["meta"])
    assert meta["step"] == 10 and meta["world_size"] == 2 and meta["format"] == "neo-dcp-1"
    assert set(full["ranks"]) == {"0", "1"}


def _digest_with_flip(rank, world_size, tmp, overrides):
    """Train; return the final digest and the digest after flipping one bit of one table."""
    from neo.train.trainer import Trainer

    tr = Trainer(tiny_config(tmp, *overrides), log=lambda *a, **k: None)
    final = tr.fit()
    with torch.no_grad():
        _, weights = next((n, b) for n, b in tr.sharded.lookup.named_buffers() if n.endswith("_weights"))
        if rank == 0:
            weights.view(-1)[:1].view(torch.int32).bitwise_xor_(1)   # one bit of one value on one rank
    return final["state_sha256"], tr.state_sha256()


def test_background_checkpoints_are_snapshots_and_resume_bit_exact(tmp_data):
    """Saves at steps 5, 10, 15 run while training goes on; resuming from step 15 gives the
    uninterrupted run's state digest, so each save captured its own step's state. The newest
    checkpoint (the one ``latest`` names) lost rank 1's file: every rank finds out (each
    verifies a share of the files) and the run resumes from the one before."""
    ck = f"{tmp_data}/snapshots"
    base = ["train.steps=20"] + MIXED + ADAGRAD_ITEM
    full = run_multiprocess(_digest_with_flip, 2, tmp_data, base + [f"train.checkpoint_dir={ck}",
                                                                     "train.checkpoint_every=5"])
    (d0, flipped0), (d1, flipped1) = full
    assert d0 == d1 and flipped0 == flipped1 and flipped0 != d0     # one bit changes the digest
    assert sorted(os.listdir(ck)) == ["latest", "step-15", "step-20"]
    os.remove(f"{ck}/step-20/__1_0.distcp")                           # rank 1's shard of the newest is lost
    resumed = run_multiprocess(_digest_with_flip, 2, tmp_data, base + [f"train.checkpoint_dir={ck}"])
    assert resumed[0][0] == d0


def test_checkpoint_of_the_previous_format_still_loads(tmp_data):
    ck = f"{tmp_data}/old-format"
    saved = run_multiprocess(_save_old_format, 2, tmp_data, ck, ["train.steps=12"] + MIXED)[0]
    for world, extra in ((2, MIXED), (1, [])):
        for out in run_multiprocess(_load_into, world, tmp_data, ck, extra):
            assert out["step"] == 12
            for name, w in saved["weights"].items():
                assert torch.equal(out["weights"][name], w), (world, name)
            for k, v in saved["dense"].items():
                assert torch.equal(out["dense"][k], v), k
    os.remove(f"{ck}/step-12/shards-1.pt")                         # a lost shard: a clear error
    with pytest.raises(AssertionError, match=r"CheckpointError: .*step-12.*earlier format.*shards-1\.pt"):
        run_multiprocess(_load_into, 2, tmp_data, ck, MIXED)


def _save_old_format(rank, world_size, tmp, ck, overrides):
    from neo.train.checkpoint import legacy
    from neo.train.trainer import Trainer

    tr = Trainer(tiny_config(tmp, *overrides), log=lambda *a, **k: None)
    tr.fit()
    legacy.save_checkpoint(ck, tr.step, sharded=tr.sharded, dense_model=tr.model, optimizer=tr.optimizer,
                           loader_state=tr.train_loader.state_dict(), pg=tr.pg, meta={"global_batch": 128})
    dense = {k: v.clone() for k, v in tr.model.state_dict().items() if not k.startswith("embedding.")}
    return {"weights": tr.sharded.full_weights(), "dense": dense}


# ----------------------------------------------------------------------------- damaged checkpoints
def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))


DAMAGE = {"truncated": (_truncate, "__0_0.distcp", r"bytes, the manifest says"),
          "flipped_byte": (_flip_byte, "__0_0.distcp", r"sha256 .* \(damaged\)"),
          "missing_shard": (os.remove, "__0_0.distcp", r"__0_0\.distcp: missing"),
          "unfinished": (os.remove, "manifest.json", r"manifest\.json: missing or unreadable")}


def _resume_and_report(rank, world_size, tmp, overrides):
    from neo.train.trainer import Trainer

    said = []
    tr = Trainer(tiny_config(tmp, *overrides), log=said.append)
    return {"step": tr.step, "said": [s for s in said if isinstance(s, str) and "damaged" in s]}


def _train(rank, world_size, tmp, overrides):
    from neo.train.trainer import Trainer

    Trainer(tiny_config(tmp, *overrides), log=lambda *a, **k: None).fit()


@pytest.fixture(scope="module")
def two_checkpoints(tmp_data):
    """step-4 and step-8 of a one-process run."""
    ck = f"{tmp_data}/two"
    run_multiprocess(_train, 1, tmp_data, ["train.steps=8", "train.checkpoint_every=4", f"train.checkpoint_dir={ck}"])
    return ck


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_is_named_and_the_newest_intact_checkpoint_chosen(tmp_path, two_checkpoints, damage):
    from neo.train.checkpoint import CheckpointError, find_resumable
    from neo.train.checkpoint.integrity import verify_checkpoint

    ck = str(tmp_path / "ck")
    shutil.copytree(two_checkpoints, ck)
    fn, name, pattern = DAMAGE[damage]
    fn(f"{ck}/step-8/{name}")
    problem = verify_checkpoint(f"{ck}/step-8")
    assert problem is not None and name in problem and re.search(pattern, problem), problem
    assert verify_checkpoint(f"{ck}/step-4") is None
    said = []
    assert find_resumable(ck, None, say=said.append) == f"{ck}/step-4"
    assert len(said) == 1 and name in said[0]
    _flip_byte(f"{ck}/step-4/__0_0.distcp")              # nothing intact: an error, not a silent fresh start
    with pytest.raises(CheckpointError, match=r"no intact checkpoint under .*step-8.*step-4.*train.resume=false"):
        find_resumable(ck, None)


def test_the_trainer_resumes_from_the_newest_intact_checkpoint(tmp_data, two_checkpoints, tmp_path):
    ck = str(tmp_path / "ck")
    shutil.copytree(two_checkpoints, ck)
    _truncate(f"{ck}/step-8/__0_0.distcp")
    (out,) = run_multiprocess(_resume_and_report, 1, tmp_data, [f"train.checkpoint_dir={ck}"])
    assert out["step"] == 4
    assert len(out["said"]) == 1 and "step-8/__0_0.distcp" in out["said"][0], out["said"]


def test_a_run_that_left_a_line_of_checkpoints_replaces_it(tmp_data, two_checkpoints, tmp_path):
    """A directory holds one line of checkpoints: after a resume from step-4 (step-8 damaged), or
    a fresh start (train.resume=false), the first save removes the later steps of the line left,
    so retention keeps this run's own and a later resume cannot pick up the other line."""
    ck = str(tmp_path / "ck")
    shutil.copytree(two_checkpoints, ck)
    _truncate(f"{ck}/step-8/__0_0.distcp")
    run_multiprocess(_train, 1, tmp_data, ["train.steps=6", "train.checkpoint_every=1", "train.checkpoint_keep=2",
                                           f"train.checkpoint_dir={ck}"])
    assert sorted(d for d in os.listdir(ck) if d.startswith("step-")) == ["step-5", "step-6"]
    fresh = str(tmp_path / "fresh")
    shutil.copytree(two_checkpoints, fresh)
    (said,) = run_multiprocess(_train_and_say, 1, tmp_data, ["train.steps=3", "train.checkpoint_every=1",
                                                            f"train.checkpoint_dir={fresh}", "train.resume=false"])
    assert any("its earlier checkpoints ['step-4', 'step-8'] are replaced" in s for s in said), said
    assert sorted(d for d in os.listdir(fresh) if d.startswith("step-")) == ["step-2", "step-3"]


def _train_and_say(rank, world_size, tmp, overrides):
    from neo.train.trainer import Trainer

    said = []
    Trainer(tiny_config(tmp, *overrides), log=said.append).fit()
    return [s for s in said if isinstance(s, str)]


@pytest.mark.parametrize("override, message", [
    # a dense layer of another shape: named before DCP's load
    ("model.dense_arch=[32,8]", r"dense tensor 'bottom\.0\.weight' is \(16, 4\) in the checkpoint, "
                                r"\(32, 4\) here \(the model section differs"),
    # another dense optimizer: named from the checkpoint's meta before DCP's load (which would fail
    # with its CheckpointException, a BaseException)
    ("optim.type=adam", r"the checkpoint's dense optimizer is Adagrad, this job's is Adam \(optim\.type differs\)"),
])
def test_a_checkpoint_of_another_model_is_a_named_error(tmp_data, two_checkpoints, tmp_path, override, message):
    """A dense model or optimizer that differs from the checkpoint's: a CheckpointError naming the
    checkpoint (and the tensor, where a shape differs); neo train exits 2."""
    ck = str(tmp_path / "ck")
    shutil.copytree(two_checkpoints, ck)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "neo.cli", "train", TINY, f"data.synthetic.cache_dir={tmp_data}/cache",
                        f"train.run_dir={tmp_data}/other", "train.progress=false", "train.steps=10",
                        f"train.checkpoint_dir={ck}", override],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert re.search(rf"neo train: error: {re.escape(ck)}/step-8: {message}", p.stderr), p.stderr[-2000:]
    assert "Traceback (most recent call last):\n" not in p.stderr.split("neo train: error:")[0]


def test_an_unwritable_checkpoint_dir_is_found_before_training(tmp_data, tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(Exception, match=r"train\.checkpoint_dir: '.*afile/ck' cannot be written \(Not a directory\)"):
        run_multiprocess(_train, 1, tmp_data, ["train.steps=2", f"train.checkpoint_dir={tmp_path}/afile/ck"])


def _resume_reordered(rank, world_size, tmp, ck):
    """Resume ``ck`` with the tiny config's tables listed in reverse (the synthetic data's
    columns follow the table order: each table would read another column)."""
    import yaml

    from neo.config import config_from_dict
    from neo.train.checkpoint import CheckpointError
    from neo.train.trainer import Trainer

    with open(TINY) as f:
        data = yaml.safe_load(f)
    data["tables"] = data["tables"][::-1]
    cfg = config_from_dict(data, [f"data.synthetic.cache_dir={tmp}/cache", f"train.run_dir={tmp}/rev",
                                  "train.progress=false", "train.batch_size=64", f"train.checkpoint_dir={ck}"])
    try:
        Trainer(cfg, log=lambda *a, **k: None)
    except CheckpointError as e:
        return str(e)
    return None


def test_resuming_with_tables_that_read_other_columns_is_refused(tmp_data, two_checkpoints, tmp_path):
    ck = str(tmp_path / "ck")
    shutil.copytree(two_checkpoints, ck)
    (err,) = run_multiprocess(_resume_reordered, 1, tmp_data, ck)
    assert err is not None and f"{ck}/step-8: tables [" in err and "read other data columns" in err, err


def test_resuming_past_the_end_or_at_another_batch_is_said(tmp_data, two_checkpoints, tmp_path):
    ck = str(tmp_path / "ck")
    shutil.copytree(two_checkpoints, ck)
    (said,) = run_multiprocess(_train_and_say, 1, tmp_data, [f"train.checkpoint_dir={ck}", "train.steps=4"])
    assert any("the checkpoint is at step 8, this run ends at step 4: nothing left to train" in s for s in said), said
    (said,) = run_multiprocess(_train_and_say, 1, tmp_data, [f"train.checkpoint_dir={ck}", "train.steps=10",
                                                            "train.batch_size=32"])
    assert any("trained at a global batch of 64, this run's is 32" in s for s in said), said
    assert not any("other data" in s for s in said), said             # the same data: nothing said
    (said,) = run_multiprocess(_train_and_say, 1, tmp_data, [f"train.checkpoint_dir={ck}", "train.steps=12",
                                                            "data.synthetic.seed=5"])
    assert any("the checkpoint was trained on other data" in s and "synth-" in s for s in said), said
