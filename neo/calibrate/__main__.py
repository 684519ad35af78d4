"""``torchrun --nproc-per-node N -m neo.calibrate`` (see :mod:`neo.calibrate`)."""

import sys

from neo.calibrate import main

sys.exit(main())
