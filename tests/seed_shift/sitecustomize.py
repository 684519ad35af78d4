"""Run at the start of every process the suite starts under ``--seed-shift`` (this folder is on
their ``PYTHONPATH``): installs the shift (seed_shift.py)."""

import seed_shift

seed_shift.install(seed_shift.shift_from_env())
