"""``neo``: the command line. Each subcommand is a module with ``main(argv)`` (COMMANDS below:
``neo/commands/<name>.py``, and ``neo.calibrate`` for ``calibrate``); ``neo <command> --help``
gives its flags. For example::

    neo plan CONFIG --world-size W --local-world-size L [--out plan.json]
    neo train CONFIG [key=value ...]
    neo mlperf CONFIG --results-dir DIR [--seeds N] [--division open|closed] [key=value ...]
    neo cache-report TRACE.npy --batch-size B --num-rows N --capacity K[,K...] --json
    neo calibrate [--out FILE]
    neo profile-layers CONFIG --out PROFILE.json
    neo partition PROFILE.json --stages S
"""

from __future__ import annotations

import importlib
import sys
from typing import List, Optional

COMMANDS = {
    "plan": ("neo.commands.plan", "print the sharding plan of a config's embedding tables"),
    "train": ("neo.commands.train", "train a model from a config file"),
    "cache-report": ("neo.commands.cache_report", "hit rates of cache policies on an id trace, against Belady"),
    "calibrate": ("neo.calibrate", "measure this machine's cost constants for the planner"),
    "profile-layers": ("neo.commands.profile_layers", "measure each dense layer's time and bytes (pipeline profile)"),
    "partition": ("neo.commands.partition", "split a layer profile into pipeline stages (PipeDream's DP)"),
    "mlperf": ("neo.commands.mlperf", "run the MLPerf DLRM-DCNv2 benchmark: time to target AUC, MLPerf logs"),
}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        unknown = bool(argv) and argv[0] not in ("-h", "--help")
        out = sys.stderr if unknown else sys.stdout
        print("usage: neo COMMAND [ARGS]\n\ncommands:", file=out)
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:14s} {help_text}", file=out)
        if unknown:
            print(f"neo: error: unknown command {argv[0]!r}", file=sys.stderr)
        return 2 if unknown else 0
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
