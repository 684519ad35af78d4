"""Per-ISA builds of the CPU kernels (csrc/cpu_isa.h): every variant this machine runs,
against the reference and against each other.

- per variant: the pooled forward is bit-identical to the reference (every dtype and row
  length, fp16/bf16 conversion of every 16-bit pattern), the fused backward + optimizer
  matches the reference (test_cpu_backend's tolerances) and is bit-identical across
  variants; the per-id weights' gradient matches the reference's.

(Which variant runs, NEO_CPU_ISA, the tuning defaults and the portable build:
test_cpu_isa_selection.py; the dot interaction per variant: tests/models/test_dlrm.py;
bucketization, the ids' range check and the memory probes per variant:
test_cpu_isa_ids_and_probes.py.)
"""

from __future__ import annotations

import pytest
import torch

import neo._C as C  # a missing build must fail here, not skip
from neo.config.embedding import OptimizerConfig, TableConfig, WeightDType
from neo.cpp import use_cpu_isa
from neo.embedding import TableBatchedEmbedding
from neo.embedding.backends.reference import round_weights, sr_uniform
from neo.sparse import KeyedJaggedBatch

from harness import clone_weights, random_batch, run_steps
from test_cpu_backend import OPTIMIZERS, train_and_compare_16bit

VARIANTS = C.cpu_isa_supported()

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


# (fwd_prefetch, fwd_far) as fp32 tables' and as 16-bit tables' distances: the defaults, no L2
# prefetch, the L1 one farther than the L2 one, both beyond every feature's ids, the nearest
PREFETCH = ((32, 256), (16, 0), (40, 8), (5000, 9000), (1, 0))


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_forward_prefetch_distances_leave_the_output_bit_identical(isa, dtype):
    """The forward's prefetches of the rows ahead (csrc/kernels/forward.h; near into L1, far into
    L2, far 0: none) stay inside each feature's ids and change no output bit, whatever the
    distances: features of none to a few hundred ids (B 1 and 40, bags of 0 to 70), 5% of the
    ids out of range (counted, adding nothing), at 1 and 2 threads, against the reference. The
    distances are set through each dtype's own fields (fwd_prefetch32 / fwd_far32 for fp32
    tables)."""
    tables = _tables(dtype, dims=(16, 64, 128), rows=3000)
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False)
    fast = TableBatchedEmbedding(tables, backend="cpu", validate=False)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(11)
    prev = torch.get_num_threads()
    try:
        for batch_size in (1, 40):
            batch = random_batch(tables, batch_size, gen, max_len=20, long_bag=70)
            values = batch.values.clone()
            bad = torch.rand(values.numel(), generator=gen) < 0.05
            values[bad] = torch.tensor([-1, 10 ** 6])[torch.randint(0, 2, (int(bad.sum()),), generator=gen)]
            batch = KeyedJaggedBatch(batch.keys, values, batch.lengths, batch_size)
            expected = ref(batch)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for near, far in PREFETCH:
                    names = ("fwd_prefetch32", "fwd_far32") if dtype == "fp32" else ("fwd_prefetch", "fwd_far")
                    C._set_tuning(**dict(zip(names, (near, far))))
                    with use_cpu_isa(isa):
                        out = fast(batch)
                    assert torch.equal(out, expected), \
                        f"{isa}, {threads} threads, B {batch_size}, ({near}, {far}): max diff {(out - expected).abs().max()}"
    finally:
        C._set_tuning()   # this CPU's defaults
        torch.set_num_threads(prev)


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
