"""Argument types shared by the ``neo`` subcommands' parsers (argparse ``type=``), and the check
of an output file's path that they make before their work."""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Optional


def output_problem(path: str, make_dirs: bool = False) -> Optional[str]:
    """Why a command could not write its output file ``path`` (None: it can), found before the
    work that produces it: a directory, a missing parent (``make_dirs``: one that cannot be made),
    a file not writable, a directory that takes no new file (``/proc``)."""
    if os.path.isdir(path):
        return "is a directory"
    parent = os.path.dirname(os.path.abspath(path))
    probe = parent
    if not os.path.isdir(parent):
        if not make_dirs:
            return "its directory does not exist"
        existing = parent
        while not os.path.exists(existing):       # the directories the command will make
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            return f"{existing} is not a directory"
        probe = existing
    elif os.path.exists(path) and not os.access(path, os.W_OK):
        return "is not writable"
    try:      # what the write needs: a new entry there (os.access says yes to root even on /proc)
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".neo-output-probe-"):
            pass
    except OSError as e:
        where = "its directory" if probe == parent else f"its directory cannot be created in {probe}"
        return f"cannot write in {where} ({e.strerror or e})" if probe == parent else f"{where} ({e.strerror or e})"
    return None


def positive_int(text: str) -> int:
    """An integer > 0, else argparse's usage error naming the value."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def non_negative_int(text: str) -> int:
    """An integer >= 0, else argparse's usage error naming the value."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0, else argparse's usage error naming the value."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v
