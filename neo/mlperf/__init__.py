"""MLPerf Training DLRM-DCNv2 benchmark harness: ``neo mlperf`` (docs/mlperf.md).

* :mod:`neo.mlperf.harness`: one run per seed, from ``init_start`` to ``run_stop``, and the summary;
* :mod:`neo.mlperf.hook`: the :class:`neo.train.trainer.FitHook` that evaluates every 0.05 epoch
  and stops at the target AUROC;
* :mod:`neo.mlperf.log`: the ``:::MLLOG`` result file (``mlperf-logging``, imported lazily);
* :mod:`neo.mlperf.rules`: what the closed division fixes, checked before a closed run;
* :mod:`neo.mlperf.summary`: olympic mean and ``summary.json``.

Nothing here is imported by ``import neo``.
"""
