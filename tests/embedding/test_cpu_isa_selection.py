"""Per-ISA builds of the CPU kernels (csrc/cpu_isa.h): which variant runs, and a portable build.

- the variants built and the runtime choice agree with the CPU's flags (/proc/cpuinfo), and the
  kernels' tuning defaults follow the CPU's vendor and family;
- NEO_CPU_ISA forces a variant, and a bad value fails the import with a readable message;
- the built library is portable: no AVX instruction outside neo::avx2 / neo::avx512, no
  AVX-512 register outside neo::avx512 (objdump).

(The kernels per variant against the reference: test_cpu_isa.py; the dot interaction per
variant: tests/models/test_dlrm.py; bucketization, the ids' range check and the memory probes
per variant: test_cpu_isa_ids_and_probes.py.)
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

import neo._C as C  # a missing build must fail here, not skip
from neo.config.embedding import TableConfig
from neo.cpp import cache_size_bytes, cpu_caches, cpu_id, cpu_isa_info, use_cpu_isa
from neo.embedding import TableBatchedEmbedding

X86 = platform.machine().lower() in ("x86_64", "amd64")
VARIANTS = C.cpu_isa_supported()


def _cpuinfo_flags() -> set:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    return set()


def test_variants_follow_the_cpu_flags():
    """Built: baseline, avx2, avx512 on x86-64 (baseline elsewhere). Runnable: those whose
    features /proc/cpuinfo lists (on the 2-core AMD EPYC dev machine: all three). Chosen by
    default: the best runnable one."""
    assert C.cpu_isa_variants() == (["baseline", "avx2", "avx512"] if X86 else ["baseline"])
    flags = _cpuinfo_flags()
    expected = ["baseline"]
    if X86 and {"avx", "avx2", "fma", "f16c"} <= flags:
        expected.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            expected.append("avx512")
    assert C.cpu_isa_supported() == expected
    features = dict(C.cpu_features())
    for name in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"):
        assert features[name] == (name in flags), name
    assert C.cpu_isa() == (os.environ.get("NEO_CPU_ISA") or expected[-1])
    info = cpu_isa_info()
    assert info["neo_cpu_isa"] == C.cpu_isa() and info["supported"] == expected
    assert info["cpu_model"] and set(info["cpu_flags"]) <= flags


def _cpuinfo():
    """The vendor_id and cpu family /proc/cpuinfo reports (empty where it is not there)."""
    info = Path("/proc/cpuinfo")
    text = info.read_text() if info.exists() else ""
    return dict(re.findall(r"^(vendor_id|cpu family)\s*:\s*(\S+)\s*$", text, re.M))


def _amd_family():
    """The CPU family /proc/cpuinfo reports where the vendor is AMD (25: Zen 3 and 4, 26: Zen 5), else None."""
    fields = _cpuinfo()
    return int(fields["cpu family"]) if fields.get("vendor_id") == "AuthenticAMD" and "cpu family" in fields else None


def _cpu_flags():
    """The flags /proc/cpuinfo reports for the first CPU (empty where it is not there)."""
    info = Path("/proc/cpuinfo")
    found = re.search(r"^flags\s*:(.*)$", info.read_text() if info.exists() else "", re.M)
    return set(found.group(1).split()) if found else set()


def _cpu_vendor():
    """The vendor_id /proc/cpuinfo reports (GenuineIntel, AuthenticAMD, ...), None where unknown."""
    return _cpuinfo().get("vendor_id")


def test_interaction_l1_next_only_on_zen5():
    """The interaction's prefetches of the next sample go into L1 (csrc/cpu_isa.h) exactly on
    AMD family 1Ah (Zen 5), read here from /proc/cpuinfo; elsewhere into L2."""
    zen5 = _amd_family() == 26
    assert C.interaction_l1_next() == zen5
    assert cpu_isa_info()["interaction_tiles"]["l1_next"] == zen5


def test_tuning_defaults_per_cpu_and_set_tuning_restores_them():
    """The prefetches by CPU (csrc/cpu_isa.cpp default_tuning), the vendor, family and flags
    read here from /proc/cpuinfo. The backward's: on AMD family 1Ah (Zen 5) no far prefetch of
    fp32 rows, the L1 prefetch 24 rows ahead and no write prefetches in the radix sort; on Intel
    CPUs the L1 prefetch 8 rows ahead; on AMD Zen 3 no far prefetch of fp32 rows; elsewhere 128,
    16 and the sort's prefetches. The forward's: 32 ids ahead into L1 and 256 into L2, but for
    fp32 tables on AMD Zen 3 (family 19h without AVX-512) 16 and none. _set_tuning sets the
    fields it is given, and a field left
    out (or negative) gets this CPU's default back, so _set_tuning() undoes a benchmark's or a
    test's settings; but the forward's distances follow the rule of the time before they were
    split: a far one left out, its near one given, is 8 times it, and an fp32 one left out
    follows the 16-bit one where that is given."""
    zen5 = _amd_family() == 26
    zen3 = _amd_family() == 25 and "avx512f" not in _cpu_flags()
    intel = _cpu_vendor() == "GenuineIntel"
    C._set_tuning()
    defaults = C._tuning()
    assert (defaults["bwd_far"], defaults["bwd_lookahead"], defaults["sort_prefetch"]) == \
        ((0, 24, 0) if zen5 else (128, 8, 1) if intel else (0, 16, 1) if zen3 else (128, 16, 1))
    assert (defaults["fwd_prefetch"], defaults["fwd_far"], defaults["fwd_stream"]) == (32, 256, 1)
    assert (defaults["fwd_prefetch32"], defaults["fwd_far32"]) == ((16, 0) if zen3 else (32, 256))
    try:
        C._set_tuning(fwd_prefetch=8, bwd_far=64)
        assert C._tuning() == {**defaults, "fwd_prefetch": 8, "fwd_far": 64, "fwd_prefetch32": 8,
                               "fwd_far32": 64, "bwd_far": 64}
        C._set_tuning(5, -1, 0)
        assert C._tuning() == {**defaults, "fwd_prefetch": 5, "fwd_far": 40, "fwd_prefetch32": 5,
                               "fwd_far32": 40, "fwd_stream": 0}
        C._set_tuning(fwd_far=0)
        assert C._tuning() == {**defaults, "fwd_far": 0, "fwd_far32": 0}
        C._set_tuning(fwd_prefetch32=12)
        assert C._tuning() == {**defaults, "fwd_prefetch32": 12, "fwd_far32": 96}
        C._set_tuning(fwd_prefetch=24, fwd_prefetch32=16, fwd_far32=0)
        assert C._tuning() == {**defaults, "fwd_prefetch": 24, "fwd_far": 192, "fwd_prefetch32": 16,
                               "fwd_far32": 0}
    finally:
        C._set_tuning()
    assert C._tuning() == defaults


def test_cpu_id_and_caches_name_the_machine(tmp_path):
    info = Path("/proc/cpuinfo")
    text = info.read_text().split("\n\n")[0] if info.exists() else ""
    field = lambda k: re.search(rf"^{k}\s*:\s*(\S+)\s*$", text, re.M)  # noqa: E731
    if all(field(k) for k in ("vendor_id", "cpu family", "model", "stepping")):
        want = "{} {}/{}/{}".format(*(field(k).group(1) for k in ("vendor_id", "cpu family", "model", "stepping")))
        assert cpu_id() == want
    else:
        assert cpu_id() is None
    # the caches, from a sysfs-like tree: a level's type names it, a missing file drops the entry
    for i, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "2048K"),
                                             ("3", "Unified", None)]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        if size:
            (d / "size").write_text(size + "\n")
    (tmp_path / "uevent").write_text("")
    assert cpu_caches(str(tmp_path)) == {"L1d": "48K", "L1i": "32K", "L2": "2048K"}
    assert cpu_caches(str(tmp_path / "absent")) == {}
    assert cpu_isa_info()["cpu_caches"] == cpu_caches() and cpu_isa_info()["cpu_id"] == cpu_id()
    # their sizes in bytes (the planner's calibration and the benchmarks' cache evictions)
    assert [cache_size_bytes(x) for x in ("48K", "2048K\n", "32M", "1G", "4096", None, "", "big")] == \
        [48 << 10, 2 << 20, 32 << 20, 1 << 30, 4096, None, None, None]
    from neo import calibrate

    machine = calibrate._machine()
    assert (machine["l2_bytes"], machine["l3_bytes"]) == tuple(cache_size_bytes(cpu_caches().get(k)) for k in ("L2", "L3"))


def _import_with(isa: str) -> subprocess.CompletedProcess:
    code = "import torch, neo._C as C, neo.cpp as p; print(C.cpu_isa()); print(p.cpu_kernels('embedding_forward') is C)"
    env = dict(os.environ, NEO_CPU_ISA=isa)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("isa", VARIANTS)
def test_neo_cpu_isa_forces_a_variant(isa):
    r = _import_with(isa.upper())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [isa, "True"]


def test_neo_C_imports_on_its_own():
    """``import neo._C`` as a process's first import (no ``import torch`` before it) loads and runs."""
    r = subprocess.run([sys.executable, "-c", "import neo._C as C; print(C.cpu_isa())"], capture_output=True,
                       text=True, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [C.cpu_isa()]


def test_neo_cpu_isa_rejects_what_it_cannot_honour():
    r = _import_with("avx9000")
    assert r.returncode != 0
    assert "NEO_CPU_ISA=avx9000 is not a CPU ISA variant" in r.stderr and "this CPU can run: " + ", ".join(VARIANTS) in r.stderr
    missing = [v for v in ("avx2", "avx512") if v not in VARIANTS]
    for isa in missing:                       # a variant this CPU lacks (none on the dev machine)
        r = _import_with(isa)
        assert r.returncode != 0 and f"asks for the {isa} kernels, but this CPU lacks" in r.stderr
    with pytest.raises(RuntimeError, match="not a CPU ISA variant"):
        C._set_cpu_isa("sse9")


def test_a_bad_interaction_tiles_setting_is_an_error_not_a_fall_back_to_torch():
    """NEO_INTERACTION_TILES=bogus: neo._C refuses to load, and ``neo.cpp.cpu_kernels`` (through
    which the dot interaction, the MLP's bias + ReLU and the input distribution find the
    kernels) raises that error instead of answering None, which would make them run their
    plain-torch paths without a word (as they did before 2026-11-30)."""
    code = ("import torch, neo.cpp as p\n"
            "try:\n    p.cpu_kernels('dot_interaction_forward')\nexcept ImportError as e:\n    print('refused:', e)\n"
            "else:\n    print('loaded')\n")
    env = dict(os.environ, NEO_INTERACTION_TILES="bogus")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:") and "NEO_INTERACTION_TILES=bogus is not a tile choice" in r.stdout
    assert "valid: auto, narrow, wide, grouped, tall" in r.stdout


def test_use_cpu_isa_switches_and_restores():
    before = C.cpu_isa()
    for isa in VARIANTS:
        with use_cpu_isa(isa):
            assert C.cpu_isa() == isa
            assert TableBatchedEmbedding([TableConfig("a", 5, 4)], backend="cpu").backend.isa == isa
        assert C.cpu_isa() == before


# ------------------------------------------------------------------------------- portability
def _functions(objdump: str):
    """(symbol, [instruction lines]) per function of `objdump -d` output."""
    name, body = None, []
    for line in objdump.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            if name is not None:
                yield name, body
            name, body = m.group(1), []
        elif name is not None and "\t" in line:
            body.append(line.split("\t", 1)[1])
    if name is not None:
        yield name, body


AVX512_OPERAND = re.compile(r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{%k")
VEX = re.compile(r"^v[a-z]")   # AVX instructions (VEX or EVEX encoded) all start with v


def test_library_is_portable():
    """Only neo::avx2 code uses AVX, only neo::avx512 code AVX-512 registers: the entry
    points, the baseline variant and every function the translation units share (inline
    functions of std::, c10::, at::, merged by the linker) run on any x86-64, so the build
    does not depend on the machine it was built on.

    A function outside the variants' namespaces may use AVX only if it is local to its
    translation unit (a compiler clone such as ``std::vector<float>::vector [clone
    .constprop.0]`` inside a variant): nothing else can call it."""
    if not X86:
        assert C.cpu_isa_variants() == ["baseline"]
        return
    lib = C.__file__
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib], capture_output=True, text=True, check=True).stdout
    kinds = {}
    for line in subprocess.run(["nm", "--defined-only", lib], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            kinds[parts[2]] = parts[1]
    seen = {"avx2": 0, "avx512": 0}
    bad = []
    for name, body in _functions(text):
        in512 = "3neo6avx512" in name               # mangled namespace neo::avx512 (in the name or its arguments)
        in2 = "3neo4avx2" in name
        local = kinds.get(name, "?") in ("t", "r")
        for ins in body:
            is512, isvex = bool(AVX512_OPERAND.search(ins)), bool(VEX.match(ins.strip()))
            if not (is512 or isvex):
                continue
            seen["avx512" if in512 else "avx2"] += in512 or in2
            if not (in512 or (in2 and not is512) or local):
                bad.append((name, kinds.get(name), ins))
                break
    assert not bad, f"{len(bad)} shared functions outside the AVX variants use AVX: {bad[:5]}"
    assert seen["avx512"] > 1000 and seen["avx2"] > 1000, seen   # the variants are really there
