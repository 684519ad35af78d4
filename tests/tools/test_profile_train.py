"""tools/profile_train.py: host reads counted by call site and restored after, the per-step counts
of a real ``neo train`` run, and the refusal of a run without train.steps."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.tools import load_tool

tool = load_tool("profile_train.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "train_tiny.yaml")


def test_host_reads_are_counted_by_site_and_the_methods_restored():
    originals = {name: getattr(torch.Tensor, name) for name in tool.HOST_READS}
    x = torch.tensor([3.0])
    with tool.HostReads() as reads:
        assert x.item() == 3.0 and int(x) == 3 and x.tolist() == [3.0]
        x.item()
    assert reads.sites == {"item (outside neo/)": 2, "__int__ (outside neo/)": 1, "tolist (outside neo/)": 1}
    assert {name: getattr(torch.Tensor, name) for name in tool.HOST_READS} == originals


def test_a_training_run_is_profiled_per_step(tmp_path):
    out, js = tmp_path / "report.txt", tmp_path / "counts.json"
    status = tool.main([TINY, "train.steps=6", f"data.synthetic.cache_dir={tmp_path}/cache", "train.eval_batches=1",
                        "--out", str(out), "--json", str(js)])
    assert status == 0
    (c,) = json.loads(js.read_text())
    assert c["steps"] == 6 and c["host_reads"] == sum(c["host_reads_by_site"].values())
    assert c["host_reads_per_step"] == pytest.approx(c["host_reads"] / 6)
    if not torch.cuda.is_available():
        assert c["device_syncs"] == c["kernel_launches"] == 0
    # the trainer reads each step's loss once (neo/train/trainer.py, _fit): the busiest float() site there
    loss_reads = max(n for site, n in c["host_reads_by_site"].items()
                     if site.startswith("__float__ train/trainer.py:") and site.endswith(" _fit"))
    assert loss_reads == 6
    text = out.read_text()
    assert "per training step:" in text and "host reads by call site" in text


def test_a_run_without_train_steps_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        tool.main([TINY])
    assert e.value.code == 2 and "train.steps" in capsys.readouterr().err
