"""``python -m neo.mlperf CONFIG --results-dir DIR [...]``, the entry point torchrun launches on every rank.

    torchrun --standalone --nproc-per-node 2 -m neo.mlperf configs/mlperf_dcnv2_tiny.yaml --results-dir runs/mlperf_tiny
"""

import sys

from neo.commands.mlperf import main

sys.exit(main())
