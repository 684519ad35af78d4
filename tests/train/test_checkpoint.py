"""Checkpoints: stop and resume == uninterrupted (1 and 2 processes), a checkpoint saved under
one plan and world size loads under another, and a crash mid-write leaves the previous one usable."""

from __future__ import annotations

import os

import pytest
import torch

from tests.multiprocess import run_multiprocess
from tests.train.test_trainer import MIXED, tiny_config, train_and_collect


# decay and warmup make the schedule's step matter; adam on a table makes the optimizer step matter
SCHEDULE = ["optim.warmup_steps=3", "optim.decay_start=5", "optim.decay_steps=20", "optim.type=adam",
            "tables.3.optimizer.type=adam", "data.shuffle_window=1000"]


POSITION = ["model.position_weights.user=3", "model.position_weights.item=2"]
"""Learnable position weights: dense parameters in the checkpoint, made at each lookup."""


@pytest.mark.parametrize("world,extra", [(1, []), (2, []), (2, POSITION)], ids=["1", "2", "2, position weights"])
def test_stop_and_resume_equals_uninterrupted(tmp_data, world, extra):
    plan = (MIXED if world == 2 else []) + extra
    ck = f"{tmp_data}/resume-{world}-{len(extra)}"
    # 80 steps of 64 x W samples: more than one epoch for W = 2 (64 steps), so the epoch change is crossed
    full = run_multiprocess(train_and_collect, world, tmp_data, ["train.steps=80"] + SCHEDULE + plan)
    first = run_multiprocess(train_and_collect, world, tmp_data,
                             ["train.steps=50", f"train.checkpoint_dir={ck}"] + SCHEDULE + plan)
    assert os.path.exists(f"{ck}/step-50/.metadata") and os.path.exists(f"{ck}/step-50/manifest.json")
    rest = run_multiprocess(train_and_collect, world, tmp_data,
                            ["train.steps=80", f"train.checkpoint_dir={ck}"] + SCHEDULE + plan)
    for f, a, b in zip(full, first, rest):
        assert a["losses"] == f["losses"][:50]
        assert b["losses"] == f["losses"][50:]            # the same subsequent losses, bit for bit
        for name in f["weights"]:
            assert torch.equal(b["weights"][name], f["weights"][name]), name
        for k in f["dense"]:
            assert torch.equal(b["dense"][k], f["dense"][k]), k
        assert any(k.startswith("position_weights.") for k in f["dense"]) == bool(extra)


def _load_into(rank, world_size, tmp, ck, overrides):
    from neo.train.trainer import Trainer

    cfg = tiny_config(tmp, f"train.checkpoint_dir={ck}", "train.resume=true", *overrides)
    tr = Trainer(cfg, log=lambda *a, **k: None)
    dense = {k: v.clone() for k, v in tr.model.state_dict().items() if not k.startswith("embedding.")}
    return {"step": tr.step, "weights": tr.sharded.full_weights(), "states": tr.sharded.full_optimizer_state(),
            "dense": dense, "position": tr.train_loader.state_dict()["position"],
            "types": sorted({t["sharding_type"] for t in tr.plan["tables"].values()})}


def test_checkpoint_loads_under_another_plan_and_world_size(tmp_data):
    ck = f"{tmp_data}/reshard"
    # plan A: 2 ranks, four sharding types (item column-wise: its row-wise adagrad state is per column shard)
    saved = run_multiprocess(train_and_collect, 2, tmp_data,
                             ["train.steps=12", f"train.checkpoint_dir={ck}", "tables.1.optimizer.type=adagrad"]
                             + MIXED)[0]
    plan_b = ["sharding.types.user=table_wise", "sharding.types.item=row_wise",
              "sharding.types.category=column_wise", "sharding.types.country=data_parallel"]
    for world, extra in ((1, []), (2, plan_b)):
        outs = run_multiprocess(_load_into, world, tmp_data, ck, ["tables.1.optimizer.type=adagrad"] + extra)
        for out in outs:
            assert out["step"] == 12
            for name, w in saved["weights"].items():
                assert torch.equal(out["weights"][name], w), (world, name)
                for s, v in saved["states"][name].items():
                    assert torch.equal(out["states"][name][s], v), (world, name, s)
            for k, v in saved["dense"].items():
                assert torch.equal(out["dense"][k], v), k
        # global sample position kept: 12 steps x 64 x 2 ranks = 1536 samples
        assert sum(o["position"] for o in outs) == 12 * 64 * 2


def _disk_full_writer(rank: int, world_size: int):
    """A DCP FileSystemWriter that fails like a full disk on the last rank, after writing part of its file."""
    import errno

    import torch.distributed.checkpoint as dcp

    class DiskFull(dcp.FileSystemWriter):
        def write_data(self, plan, planner):
            if rank == world_size - 1:
                path = os.path.join(self.path, f"__{rank}_0.distcp")
                with open(path, "wb") as f:
                    f.write(b"\0" * 1000)                       # a partial file, then the disk is full
                raise OSError(errno.ENOSPC, "No space left on device", path)
            return super().write_data(plan, planner)

    return DiskFull


def _crash_mid_write(rank, world_size, tmp, ck, async_save):
    from neo.train.checkpoint import CheckpointError, latest_checkpoint, save_checkpoint
    from neo.train.trainer import Trainer

    cfg = tiny_config(tmp, "train.steps=6", f"train.checkpoint_dir={ck}", "train.resume=false")
    tr = Trainer(cfg, log=lambda *a, **k: None)
    tr.fit()                                               # writes step-6
    good = latest_checkpoint(ck)
    expected = tr.sharded.full_weights()
    tr.step = 7
    with torch.no_grad():                                  # change the weights: the old checkpoint must win
        for name, buf in tr.sharded.lookup.named_buffers():
            if name.endswith("_weights"):
                buf.add_(1.0)
    message = ""
    try:
        save_checkpoint(ck, 7, sharded=tr.sharded, dense_model=tr.model, optimizer=tr.optimizer,
                        loader_state=tr.train_loader.state_dict(), pg=tr.pg, async_save=async_save,
                        storage_writer=_disk_full_writer(rank, world_size))
        raised = False
    except CheckpointError as e:
        raised, message = True, str(e)
    after = latest_checkpoint(ck)
    cfg2 = tiny_config(tmp, f"train.checkpoint_dir={ck}", "train.resume=true")
    tr2 = Trainer(cfg2, log=lambda *a, **k: None)
    same = all(torch.equal(tr2.sharded.full_weights()[n], w) for n, w in expected.items())
    return {"raised": raised, "message": message, "good": good, "after": after, "step": tr2.step, "same": same,
            "tmp_left": os.path.exists(os.path.join(ck, "tmp-7"))}


@pytest.mark.parametrize("world,async_save", [(1, False), (2, True)])
def test_full_disk_mid_write_keeps_previous_checkpoint(tmp_data, world, async_save):
    ck = f"{tmp_data}/crash-{world}"
    for out in run_multiprocess(_crash_mid_write, world, tmp_data, ck, async_save):
        assert out["raised"]
        # every rank's error names the failing rank, the cause and the file
        assert f"rank {world - 1}" in out["message"] and "No space left on device" in out["message"], out["message"]
        assert f"__{world - 1}_0.distcp" in out["message"] and "step-6" in out["message"]
        assert out["good"].endswith("step-6") and out["after"] == out["good"]
        assert out["step"] == 6 and out["same"] and not out["tmp_left"]


def test_checkpoint_keep_leaves_the_newest(tmp_data):
    ck = f"{tmp_data}/keep"
    run_multiprocess(train_and_collect, 1, tmp_data,
                     ["train.steps=10", "train.checkpoint_every=2", "train.checkpoint_keep=3",
                      f"train.checkpoint_dir={ck}"])
    assert sorted(d for d in os.listdir(ck) if d.startswith("step-")) == ["step-10", "step-6", "step-8"]
    with open(f"{ck}/latest") as f:
        assert f.read().strip() == "step-10"


def test_checkpoint_keep_below_one_is_refused(tmp_data):
    from neo.config.embedding import ConfigError

    with pytest.raises(ConfigError, match=r"train.checkpoint_keep: must be >= 1, got 0"):
        tiny_config(tmp_data, "train.checkpoint_keep=0")


@pytest.mark.parametrize("content", [b"\x00\xff", b"step-4\x00", b"sub/step-4", b"", b"  \n"])
def test_a_damaged_latest_file_is_passed_over(tmp_path, content):
    """``latest`` not UTF-8, with a NUL byte or a path, or empty (found by the bad-input audit of
    2026-11-29: not UTF-8 stopped the resume with UnicodeDecodeError): it names no checkpoint,
    and the step-<N> directories are still candidates, newest first."""
    from neo.train.checkpoint.layout import candidates, latest_checkpoint

    root = tmp_path / "ck"
    for step in (2, 4):
        (root / f"step-{step}").mkdir(parents=True)
        (root / f"step-{step}" / ".metadata").write_bytes(b"")
    (root / "latest").write_bytes(content)
    assert latest_checkpoint(str(root)) is None
    assert candidates(str(root)) == [str(root / "step-4"), str(root / "step-2")]
    (root / "latest").write_bytes(b"step-2\n")                     # intact: named first
    assert latest_checkpoint(str(root)) == str(root / "step-2")
    assert candidates(str(root)) == [str(root / "step-2"), str(root / "step-4")]
