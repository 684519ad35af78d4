"""Nothing in the repository refers to a path outside it.

A user's clone, an sdist or anyone's CI has only the repository: a test, tool or module that
reads ``../something`` or ``/home/someone/...`` works on the machine it was written on and
nowhere else. Every tracked file outside ``.ci/`` is scanned for

* relative paths that climb out of the repository (``../other_project/data``), as text (code,
  configs, docs) and as ``".."`` components of ``os.path.join(...)`` / ``Path(...)`` calls;
  a ``../`` path is accepted only where it names something that exists inside the repository,
  resolved from the file's own folder (a Markdown link) or from the repository root;
* absolute paths outside the operating system's own folders (``/work/...``, ``/scratch/...``).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from typing import Iterator, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = (".ci/",)
TEXT_SUFFIXES = (".py", ".sh", ".md", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".toml", ".cpp", ".h", ".cu",
                 ".json", ".tsv")
# Folders every Unix system has; an absolute path into any other one is somebody's machine.
SYSTEM_DIRS = {"dev", "proc", "sys", "tmp", "usr", "bin", "sbin", "etc", "lib", "lib64", "var", "run"}

UP_PATH = re.compile(r"(?<![\w./~-])((?:\.\./)+[\w.<>*-]+(?:/[\w.<>*-]+)*)")
ABS_PATH = re.compile(r"(?:^|(?<=[\s\"'`(=,\[]))/([A-Za-z_][\w.-]*)/[\w.<>*-]+")


def repository_files() -> List[str]:
    """Tracked and new (not ignored) files, relative to the root; the whole tree without git."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
        files = [f for f in out.splitlines() if os.path.isfile(os.path.join(REPO, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(REPO):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "__pycache__")]
            files += [os.path.relpath(os.path.join(root, n), REPO) for n in names]
    return sorted(f for f in files if f.endswith(TEXT_SUFFIXES) and not f.startswith(SKIP_DIRS))


def _inside(path: str) -> bool:
    return os.path.commonpath([REPO, path]) == REPO


def _resolves_inside(rel_file: str, target: str) -> bool:
    """``target`` (a ``../`` path) names an existing path inside the repository from the file's
    folder or from the root. Placeholders (``<year>``, ``*``) stop the check at their component."""
    concrete = []
    for part in target.split("/"):
        if any(c in part for c in "<>*"):
            break
        concrete.append(part)
    target = "/".join(concrete)
    for base in (os.path.dirname(os.path.join(REPO, rel_file)), REPO):
        path = os.path.normpath(os.path.join(base, target))
        if _inside(path) and os.path.exists(path):
            return True
    return False


def _joined_up_paths(source: str) -> Iterator[Tuple[int, str]]:
    """``".."`` components in path-building calls, with the literal components after them."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        args = node.args
        for i, arg in enumerate(args):
            if isinstance(arg, ast.Constant) and arg.value == "..":
                tail = []
                for a in args[i:]:
                    if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
                        break
                    tail.append(a.value)
                yield node.lineno, "/".join(tail)
                break


def outside_references(rel_file: str, text: str) -> List[str]:
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in UP_PATH.finditer(line):
            if not _resolves_inside(rel_file, m.group(1)):
                found.append(f"{rel_file}:{lineno}: {m.group(1)}")
        for m in ABS_PATH.finditer(line):
            if m.group(1) not in SYSTEM_DIRS:
                found.append(f"{rel_file}:{lineno}: {m.group(0)}")
    if rel_file.endswith(".py"):
        for lineno, target in _joined_up_paths(text):
            if not _resolves_inside(rel_file, target):
                found.append(f"{rel_file}:{lineno}: {target} (a path-building call)")
    return found


def test_no_tracked_file_refers_outside_the_repository():
    files = repository_files()
    assert "data_pipeline/samples/criteo_kaggle_sample.tsv" in files  # the scan sees the tree
    bad = []
    for rel in files:
        if rel == os.path.relpath(os.path.abspath(__file__), REPO):
            continue  # this file's docstring names the patterns it looks for
        with open(os.path.join(REPO, rel), "rb") as f:
            raw = f.read()
        if b"\0" in raw:
            continue
        bad += outside_references(rel, raw.decode("utf-8", errors="replace"))
    assert not bad, "paths outside the repository (a clone has only the repository):\n" + "\n".join(bad)


def test_the_scan_finds_what_it_must():
    """The detector itself, on lines like the ones that once broke a fresh clone."""
    assert outside_references("tests/data_pipeline/dp_helpers.py",
                              'SHARED = os.path.join(REPO, "..", "other_project", "data")\n')
    assert outside_references("tools/bench_data.py", 'default="../other_project/data/criteo_kaggle_sample.tsv"\n')
    assert outside_references("docs/x.md", "the stats file in `/work/other_project/data`\n")
    assert outside_references("configs/x.yaml", "cache_dir: /scratch/mh\n")
    # Paths that stay inside, system paths and prose are fine.
    assert not outside_references("docs/training.md", "see [the README](../README.md)\n")
    assert not outside_references("tools/bench_planner.py",
                                  'sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))\n')
    assert not outside_references("neo/distributed/shm.py", 'path = "/dev/shm/neo"; rate = "lines/s per core"\n')
    assert not outside_references("docs/x.md", "https://github.com/facebookresearch/dlrm_datasets/tree/main\n")
