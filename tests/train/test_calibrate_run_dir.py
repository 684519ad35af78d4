"""``neo calibrate``'s small-model runs (``neo.calibrate.measure.machinery``) leave only the data
cache behind: each run's logs go to a temporary folder of its rank, removed afterwards."""

from __future__ import annotations

import os

from tests.multiprocess import run_multiprocess


def _listing(root: str) -> list:
    """Every path under ``root`` (relative), sorted."""
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)


def _machinery_twice(rank: int, world_size: int, tmp: str) -> list:
    """Two quick machinery runs with ``tmp`` as the temporary folder; Neo's paths in ``tmp`` after
    each (besides the data cache)."""
    import tempfile

    import torch.distributed as dist

    from neo.calibrate import measure
    from neo.distributed import ProcessGroups

    tempfile.tempdir = tmp
    pg = ProcessGroups.build(world_size)
    after = []
    for _ in range(2):
        run = measure.machinery(pg, quick=True)
        assert run["measured"] and run["plan"]
        dist.barrier()                                            # every rank's run over
        after.append([p for p in _listing(tmp)                   # torch's own (torchinductor_*) aside
                      if p.startswith("neo-") and not p.startswith(os.path.join("neo-calibrate", "data"))])
        dist.barrier()                                            # every rank's listing taken before the next run
    return after


def test_machinery_runs_leave_no_run_folder(tmp_path):
    """Two ranks, two runs each: afterwards only ``neo-calibrate/data`` (the reused cache) is left,
    no ``run<rank>`` log folder that grows with every calibration."""
    outs = run_multiprocess(_machinery_twice, 2, str(tmp_path), timeout_s=300)
    assert outs[0] == outs[1] == [["neo-calibrate"], ["neo-calibrate"]]
    assert os.listdir(tmp_path / "neo-calibrate") == ["data"]
