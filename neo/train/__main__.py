"""``python -m neo.train CONFIG [key=value ...]``, the entry point torchrun launches on every rank.

    torchrun --standalone --nproc-per-node 2 -m neo.train configs/main_job.yaml
"""

import sys

from neo.commands.train import main, record_exit_status

sys.exit(record_exit_status(main()))
