"""Make the repository root importable (``neo``, ``tests.multiprocess``) here and in spawned ranks."""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
