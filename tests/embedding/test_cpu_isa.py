"""Per-ISA builds of the CPU kernels (csrc/cpu_isa.h): every variant this machine runs,
against the reference and against each other.

- the variants built and the runtime choice agree with the CPU's flags (/proc/cpuinfo);
- NEO_CPU_ISA forces a variant, and a bad value fails the import with a readable message;
- per variant: the pooled forward is bit-identical to the reference (every dtype and row
  length, fp16/bf16 conversion of every 16-bit pattern), the fused backward + optimizer
  matches the reference (test_cpu_backend's tolerances) and is bit-identical across
  variants; the per-id weights' gradient matches the reference's;
- the built library is portable: no AVX instruction outside neo::avx2 / neo::avx512, no
  AVX-512 register outside neo::avx512 (objdump).

(The dot interaction per variant: tests/models/test_dlrm.py; bucketization, the ids' range
check and the memory probes per variant: test_cpu_isa_ids_and_probes.py.)
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import neo._C as C  # a missing build must fail here, not skip
from neo.config.embedding import OptimizerConfig, TableConfig, WeightDType
from neo.cpp import cpu_caches, cpu_id, cpu_isa_info, use_cpu_isa
from neo.embedding import TableBatchedEmbedding
from neo.embedding.backends.reference import round_weights, sr_uniform
from neo.sparse import KeyedJaggedBatch

from harness import clone_weights, random_batch, run_steps
from test_cpu_backend import OPTIMIZERS, train_and_compare_16bit

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
    """The backward's prefetches by CPU (csrc/cpu_isa.cpp default_tuning): on AMD family 1Ah
    (Zen 5) no far prefetch of fp32 rows, the L1 prefetch 24 rows ahead and no write prefetches
    in the radix sort; on Intel CPUs the L1 prefetch 8 rows ahead; elsewhere 128, 16 and the
    sort's prefetches (the vendor and family read here from /proc/cpuinfo). _set_tuning sets
    the fields it is given, and a field left out (or negative) gets this CPU's default back, so
    _set_tuning() undoes a benchmark's or a test's settings."""
    zen5 = _amd_family() == 26
    intel = _cpu_vendor() == "GenuineIntel"
    C._set_tuning()
    defaults = C._tuning()
    assert (defaults["bwd_far"], defaults["bwd_lookahead"], defaults["sort_prefetch"]) == \
        ((0, 24, 0) if zen5 else (128, 8, 1) if intel else (128, 16, 1))
    assert (defaults["fwd_prefetch"], defaults["fwd_stream"]) == (32, 1)
    try:
        C._set_tuning(fwd_prefetch=8, bwd_far=64)
        assert C._tuning() == {**defaults, "fwd_prefetch": 8, "bwd_far": 64}
        C._set_tuning(5, -1, 0)
        assert C._tuning() == {**defaults, "fwd_prefetch": 5, "fwd_stream": 0}
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


# ------------------------------------------------------------------------------- forward
DIMS = (4, 12, 16, 36, 64, 128, 256, 320)   # vector remainders, one pass, passes of wide rows


def _tables(dtype: str, dims=DIMS, rows: int = 60):
    return [TableConfig(f"t{d}", rows, d, feature_names=(f"f{d}", f"g{d}"), dtype=dtype,
                        pooling="mean" if d % 8 else "sum") for d in dims]


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_forward_is_bit_identical_to_the_reference(isa, dtype, weighted):
    tables = _tables(dtype)
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False)
    fast = TableBatchedEmbedding(tables, backend="cpu", validate=False)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        batch = random_batch(tables, 24, gen, max_len=12, long_bag=70, weighted=weighted)
        with use_cpu_isa(isa):
            out = fast(batch)
        expected = ref(batch)
        assert torch.equal(out, expected), f"{isa}: max diff {(out - expected).abs().max()}"


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_forward_skips_and_counts_bad_ids_in_long_features(isa, dtype, weighted):
    """Features of about 2000 ids: most bags take the forward's loop without bound tests (every
    prefetch target inside the feature, the prefetched ids unchecked). Ids out of range there,
    and in the last bags (the tested loop), add nothing and are counted: the reference's
    output (validate=False) to the bit, and the count of bad ids."""
    tables = [TableConfig(f"t{d}", 500, d, feature_names=(f"f{d}", f"g{d}"), dtype=dtype) for d in (16, 64, 36)]
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False)
    fast = TableBatchedEmbedding(tables, backend="cpu", validate=False)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(11)
    batch = random_batch(tables, 200, gen, max_len=20, weighted=weighted)
    values = batch.values.clone()
    bad = torch.rand(values.numel(), generator=gen) < 0.1
    junk = torch.tensor([-1, -(2 ** 40), 500, 10 ** 6, 2 ** 62, -(2 ** 63)])
    values[bad] = junk[torch.randint(0, len(junk), (int(bad.sum()),), generator=gen)]
    batch = KeyedJaggedBatch(batch.keys, values, batch.lengths, batch.batch_size, weights=batch.weights)
    assert min(batch.offset_per_key()[f + 1] - batch.offset_per_key()[f] for f in range(6)) > 1000
    with use_cpu_isa(isa), torch.no_grad():
        out = fast(batch)
    assert torch.equal(out, ref(batch)), isa
    assert fast.backend.last_invalid_count == int(((values < 0) | (values >= 500)).sum()) > 0


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_weight_grad_matches_the_reference(isa, dtype):
    """The gradient of per-id weights that require grad (csrc/kernels/weight_grad.h) against the
    reference's torch ops, every row length of ``_tables`` (sum and mean pooling), with ids out of
    range (zero gradient) in long and short features; the tables' update is not part of it (eval)."""
    tables = _tables(dtype)
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False).eval()
    fast = TableBatchedEmbedding(tables, backend="cpu", validate=False).eval()
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(13)
    batch = random_batch(tables, 24, gen, max_len=12, long_bag=70, weighted=True)
    values = batch.values.clone()
    bad = torch.rand(values.numel(), generator=gen) < 0.05
    values[bad] = torch.tensor([-1, 10 ** 6])[torch.randint(0, 2, (int(bad.sum()),), generator=gen)]
    grad = torch.randn(24, ref.output_dim, generator=gen)
    grads = []
    for m in (ref, fast):
        b = KeyedJaggedBatch(batch.keys, values, batch.lengths, 24, weights=batch.weights.clone().requires_grad_())
        with use_cpu_isa(isa):
            m(b).backward(grad)
        grads.append(b.weights.grad)
    assert bad.any() and torch.equal(grads[1][bad], torch.zeros(int(bad.sum())))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5, msg=lambda m: f"{isa}: {m}")


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_forward_streaming_stores_match_plain_stores_and_the_reference(isa, dtype):
    """Output rows of whole aligned cache lines are written with streaming stores
    (csrc/kernels/forward.h): a row width of 480 floats with features at aligned (64 at 32, 320
    at 96, 48 at 432) and unaligned places (16 at 8; widths 4, 8, 12), at 1 and 2 threads;
    the same bits with the streaming stores switched off, and the reference's."""
    dims = (8, 16, 8, 64, 320, 4, 12, 48)
    tables = [TableConfig(f"t{i}", 500, d, dtype=dtype) for i, d in enumerate(dims)]
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False)
    fast = TableBatchedEmbedding(tables, backend="cpu", validate=False)
    clone_weights(ref, fast)
    batch = random_batch(tables, 300, torch.Generator().manual_seed(5), max_len=30, long_bag=90)
    expected = ref(batch)
    prev = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs = []
            for stream in (1, 0):
                C._set_tuning(fwd_stream=stream)
                with use_cpu_isa(isa):
                    outs.append(fast(batch))
            assert outs[0].data_ptr() % 64 == 0                  # the streaming stores' precondition
            for out in outs:
                assert torch.equal(out, expected), f"{isa}, {threads} threads: max diff {(out - expected).abs().max()}"
    finally:
        C._set_tuning()   # this CPU's defaults
        torch.set_num_threads(prev)


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_converts_every_16_bit_pattern_exactly(isa, dtype):
    """One row per 16 patterns of all 65,536 (normal, subnormal, zero, inf, NaN), one id per
    bag: the output is the exact fp32 value of every pattern, as torch converts it."""
    patterns = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
    name = "fp16" if dtype == torch.float16 else "bf16"
    tables = [TableConfig("p", (1 << 16) // 16, 16, dtype=name)]
    emb = TableBatchedEmbedding(tables, backend="cpu", validate=False)
    emb.table_weight("p").copy_(patterns.view(-1, 16))
    ids = torch.arange((1 << 16) // 16)
    batch = KeyedJaggedBatch(("p",), ids, torch.ones_like(ids), ids.numel())
    with use_cpu_isa(isa), torch.no_grad():
        out = emb(batch)
    expected = torch.zeros(ids.numel(), 16) + patterns.view(-1, 16).float()   # the pooling's sum from +0.0
    nan = expected.isnan()
    assert nan.sum() > 0 and torch.equal(out.isnan(), nan)
    assert torch.equal(out[~nan].view(torch.int32), expected[~nan].view(torch.int32))


# ------------------------------------------------------------------------------- backward
@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_backward_update_matches_the_reference(isa, opt, dtype):
    """test_cpu_backend's comparison (same tolerances), with the kernels of each variant."""
    o = OptimizerConfig(opt, lr=0.05, weight_decay=0.01, initial_accumulator_value=0.01 if "adagrad" in opt else 0.0)
    tables = [TableConfig(f"t{d}", 50, d, feature_names=(f"f{d}",), dtype=dtype, stochastic_rounding=dtype != "fp32",
                          pooling="mean" if d == 12 else "sum", optimizer=o) for d in (4, 12, 16, 64, 128, 72)]
    with use_cpu_isa(isa):
        if dtype == "fp32":
            run_steps(tables, "cpu", steps=2, batch_size=16, weighted=True, long_bag=40)
        else:
            train_and_compare_16bit(tables, steps=2, batch_size=16, weighted=True, long_bag=40)


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("opt", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_fp32_update_without_weight_decay_matches_the_reference(isa, opt, weighted):
    """The path that sums and updates fp32 rows in registers (rows of up to 8 vectors; SGD,
    Adagrad and row-wise Adagrad without weight decay): exact for SGD and Adagrad (the
    reference's operations in its order), row-wise Adagrad to its mean's reduction order.
    D 24 and 256 take the other path (not whole vectors / too many of them)."""
    o = OptimizerConfig(opt, lr=0.05, initial_accumulator_value=0.01 if "adagrad" in opt else 0.0)
    tables = [TableConfig(f"t{i}", 60, d, feature_names=(f"f{i}",), pooling=p, optimizer=o)
              for i, (d, p) in enumerate([(16, "sum"), (32, "mean"), (64, "sum"), (128, "mean"), (24, "sum"),
                                          (256, "sum")])]
    tol = dict(rtol=1e-5, atol=1e-6) if opt == "rowwise_adagrad" else dict(rtol=0.0, atol=0.0)
    with use_cpu_isa(isa):
        run_steps(tables, "cpu", steps=3, batch_size=32, weighted=weighted, long_bag=40, **tol)


EDGE_VALUES = [0.0, -0.0, 1.0, -3.0000001, 1e-8, 6e-8, -3e-6, -2.5e-5, 6.1e-5, 65504.0, 65519.0, 65520.0, -1e5,
               1.1754944e-38, -1e-40, 3.38e38, 3.4e38, float("inf"), float("nan"), 0.1, -0.30000001, 2049.0]


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("sr", [True, False], ids=["stochastic", "nearest"])
def test_16bit_rounding_of_edge_values_is_the_references(isa, dtype, sr):
    """The update's fp32 -> fp16/bf16 rounding (eight lanes at a time on AVX2 / AVX-512, with
    the stochastic-rounding hash in 32-bit lanes) on values at the formats' edges: zeros,
    subnormals, the largest finite values and what overflows, inf, NaN, ties. SGD with lr 1
    from zero weights writes round(target) exactly where the reference does."""
    targets = torch.tensor(EDGE_VALUES * 8)[: 16 * 10].view(10, 16)     # 10 rows of 16: whole vectors and more
    targets = targets * (1 + torch.arange(10).view(10, 1) * 1e-3)     # vary the mantissas row by row
    tables = [TableConfig("e", 10, 16, dtype=dtype, stochastic_rounding=sr, optimizer=OptimizerConfig("sgd", lr=1.0))]
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False, seed=4)
    fast = TableBatchedEmbedding(tables, backend="cpu", validate=False, seed=4)
    for m in (ref, fast):
        m.table_weight("e").zero_()
    batch = KeyedJaggedBatch(("e",), torch.arange(10), torch.ones(10, dtype=torch.int64), 10)
    ref(batch).backward(-targets)
    with use_cpu_isa(isa):
        fast(batch).backward(-targets)
    a, b = ref.table_weight("e"), fast.table_weight("e")
    assert torch.equal(a.isnan(), b.isnan()) and a.isnan().any()
    assert torch.equal(a[~a.isnan()].view(torch.int16), b[~b.isnan()].view(torch.int16))


# Row starts (flat element index of a row's first element): small, a row ending exactly at
# 2^32, rows straddling 2^32 (their indices' high halves differ: the kernels' scalar path),
# a row starting at 2^32, and far above.
ELEM0 = [0, 5, 2**32 - 3 * 24, 2**32 - 24 - 5, 2**32 - 1, 2**32, 2**40 + 3, 2**62 + 11]


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("sr", [True, False], ids=["stochastic", "nearest"])
def test_16bit_row_stores_match_the_reference_at_any_element_index(isa, dtype, sr):
    """The optimizers' row store (store_row, via neo._C._round_rows) at element indices no
    test table reaches: the hash's high half and rows straddling 2^32, against the reference's
    sr_uniform + round_weights on the same indices. Rows of 24 (whole vectors and a tail)."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 24, generator=gen) * torch.tensor([1e-3, 0.1, 10.0, 3e3]).view(4, 1)).contiguous()
    wdt = WeightDType.FP16 if dtype == "fp16" else WeightDType.BF16
    for seed, step in ((0, 1), (2**63 + 5, 2**20)):
        for elem0 in ELEM0:
            elems = elem0 + torch.arange(x.numel(), dtype=torch.int64).view(4, 24)
            want = round_weights(x, wdt, sr, sr_uniform(seed, step, elems) if sr else None)
            with use_cpu_isa(isa):
                got = C._round_rows(x, dtype, sr, seed - 2**64 if seed >= 2**63 else seed, step, elem0)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (seed, step, elem0)
    with pytest.raises(RuntimeError, match="elem0"):
        C._round_rows(x, dtype, sr, 0, 1, 2**63 - 10)


def _train(tables, batches, grads):
    emb = TableBatchedEmbedding(tables, backend="cpu", seed=5)
    outs = []
    for b, g in zip(batches, grads):
        out = emb(b)
        outs.append(out.detach().clone())
        out.backward(g)
    return outs + [emb.table_weight(t.name).clone() for t in tables] + \
        [s.clone() for t in tables for s in emb.table_optimizer_state(t.name).values()]


@pytest.mark.parametrize("opt,dtype,wd", [("rowwise_adagrad", "fp32", 0.01), ("adam", "fp16", 0.01),
                                          ("lamb", "bf16", 0.01), ("adagrad", "fp32", 0.01), ("sgd", "bf16", 0.01),
                                          ("rowwise_adagrad", "fp32", 0.0), ("adagrad", "fp32", 0.0)])
def test_variants_train_bit_identically(opt, dtype, wd):
    """Same IEEE operations in the same order in every variant (no FMA in the embedding
    kernels): outputs, weights and optimizer state agree to the last bit. Without weight
    decay, fp32 rows of whole vectors are summed and updated in registers (backward.h)."""
    tables = [TableConfig(f"t{i}", 300, d, feature_names=(f"f{i}",), pooling=p, dtype=dtype,
                          optimizer=OptimizerConfig(opt, lr=0.05, weight_decay=wd))
              for i, (d, p) in enumerate([(4, "sum"), (12, "mean"), (64, "sum"), (128, "mean"), (256, "sum")])]
    gen = torch.Generator().manual_seed(9)
    batches = [random_batch(tables, 64, gen, max_len=20, weighted=True) for _ in range(3)]
    grads = [torch.randn(64, sum(t.dim for t in tables), generator=gen) for _ in batches]
    results = {}
    for isa in VARIANTS:
        with use_cpu_isa(isa):
            results[isa] = _train(tables, batches, grads)
    for isa in VARIANTS[1:]:
        for a, b in zip(results[VARIANTS[0]], results[isa]):
            assert torch.equal(a, b), f"{isa} differs from {VARIANTS[0]}"


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
