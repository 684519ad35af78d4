"""``python -m neo.async_train CONFIG [key=value ...]``: WSP training, the entry point torchrun launches.

    torchrun --standalone --nproc-per-node 4 -m neo.async_train configs/train_tiny.yaml async_train.staleness=2
"""

import sys

from neo.async_train.wsp import main

sys.exit(main())
