"""The C++ CPU backend (``neo._C``) against the reference oracle.

Tolerances:

- fp32: weights and state within 1e-5 relative (``run_steps``); the pooled forward is
  compared the same way (in practice it is bit-identical: same summation order, no FMA).
- fp16/bf16 weights: bit-identical for the element-wise optimizers (SGD, Adagrad, Adam):
  same operation order, no FMA, and the reference's square root is the correctly rounded
  IEEE one, as the kernels'. rowwise_adagrad's ``mean(g*g)`` and LAMB's row norms are
  reductions whose order inside torch is its own, so a rare fp32 value differs in its last
  bit and, after rounding, a rare fp16/bf16 weight by 1 ulp of the storage type. For those
  two we allow 1 ulp on a small share of elements; the modules are re-synchronised after
  every step so that differences do not compound. Where an update nearly cancels its weight
  the fp32 results may differ by their own rounding error, larger than a 16-bit ulp of the
  small result; with stochastic rounding two such results on either side of a 16-bit value
  may step 2 ulps apart, which is allowed where the element's uniform makes it possible.
"""

from __future__ import annotations

import pytest
import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch

from harness import assert_16bit_update_close, clone_weights, random_batch, run_steps, ulp_diff

import neo._C as _C  # noqa: E402  (built by tools/setup.sh; a missing build must fail here, not skip)

OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam", "lamb"]
# (dtype, stochastic rounding)
DTYPES = [("fp32", False), ("fp16", True), ("fp16", False), ("bf16", True), ("bf16", False)]


def make_tables(opt: str, dtype: str, sr: bool, pooling: str, wd: float = 0.01, lr: float = 0.05):
    """Mixed dims (4, 12, 64), a shared table (two features), one mean table whatever ``pooling`` says."""
    o = OptimizerConfig(opt, lr=lr, weight_decay=wd, initial_accumulator_value=0.01 if "adagrad" in opt else 0.0)
    kw = dict(dtype=dtype, stochastic_rounding=sr, optimizer=o)
    return [
        TableConfig("shared", 40, 4, feature_names=("s1", "s2"), pooling=pooling, **kw),
        TableConfig("mid", 30, 12, pooling="mean", **kw),
        TableConfig("wide", 100, 64, pooling=pooling, **kw),
    ]


def train_and_compare_16bit(tables, steps=3, batch_size=16, weighted=False, long_bag=0, seed=0):
    """Like harness.run_steps, with the fp16/bf16 rule of the module docstring for the weights."""
    exact = tables[0].optimizer.type.value in ("sgd", "adagrad", "adam")
    ref = TableBatchedEmbedding(tables, backend="reference", seed=seed)
    fast = TableBatchedEmbedding(tables, backend="cpu", seed=seed)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(seed + 1)
    for step in range(steps):
        batch = random_batch(tables, batch_size, gen, weighted=weighted, long_bag=long_bag)
        before = {t.name: ref.table_weight(t.name).float() for t in tables}      # copies (16-bit storage)
        out_ref, out_fast = ref(batch), fast(batch)
        torch.testing.assert_close(out_fast, out_ref, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step} forward: {m}")
        grad = torch.randn(out_ref.shape, generator=gen)
        out_ref.backward(grad)
        out_fast.backward(grad)
        for t in tables:
            wa, wb = ref.table_weight(t.name), fast.table_weight(t.name)
            where = f"step {step} table {t.name}"
            if exact:
                d = ulp_diff(wa, wb)
                assert torch.equal(wa.view(torch.int16), wb.view(torch.int16)), f"{where}: {int((d > 0).sum())} weights differ"
            else:
                assert_16bit_update_close(ref, t, step + 1, before[t.name], wa, wb, where)
            sa, sb = ref.table_optimizer_state(t.name), fast.table_optimizer_state(t.name)
            for k in sa:
                torch.testing.assert_close(sb[k], sa[k], rtol=1e-5, atol=1e-6, msg=lambda m: f"{where} state {k}: {m}")
            # re-synchronise, so that a 1-ulp difference does not compound over the steps
            wb.copy_(wa)
            for k in sa:
                sb[k].copy_(sa[k])


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("dtype,sr", DTYPES, ids=[f"{d}{'-sr' if s else ''}" for d, s in DTYPES])
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_matches_reference(opt, dtype, sr, pooling, weighted):
    tables = make_tables(opt, dtype, sr, pooling)
    if dtype == "fp32":
        run_steps(tables, "cpu", steps=2, batch_size=16, weighted=weighted, long_bag=30)
    else:
        train_and_compare_16bit(tables, steps=2, batch_size=16, weighted=weighted, long_bag=30)


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_no_weight_decay_long_bag(opt):
    """wd = 0 (a separate code path), a 500-id bag, duplicates within and across bags."""
    run_steps(make_tables(opt, "fp32", False, "sum", wd=0.0), "cpu", steps=2, batch_size=8, long_bag=500, weighted=True)


@pytest.mark.parametrize("opt", ["sgd", "rowwise_adagrad", "adam"])
def test_bf16_long_bag(opt):
    train_and_compare_16bit(make_tables(opt, "bf16", True, "mean"), steps=2, batch_size=8, long_bag=500)


def _empty_batch(tables, batch_size):
    keys = tuple(f for t in tables for f in t.feature_names)
    return KeyedJaggedBatch(keys, torch.zeros(0, dtype=torch.int64),
                            torch.zeros(len(keys) * batch_size, dtype=torch.int64), batch_size)


def test_all_bags_empty():
    tables = make_tables("adam", "fp32", False, "mean")
    batches = [_empty_batch(tables, 4), random_batch(tables, 4, torch.Generator().manual_seed(3)), _empty_batch(tables, 4)]
    run_steps(tables, "cpu", steps=3, batches=batches)
    emb = TableBatchedEmbedding(tables, backend="cpu")
    out = emb(_empty_batch(tables, 4))
    assert out.shape == (4, emb.output_dim) and not out.any()


def test_batch_of_one_and_single_id():
    tables = make_tables("rowwise_adagrad", "fp32", False, "sum")
    keys = tuple(f for t in tables for f in t.feature_names)
    b = KeyedJaggedBatch(keys, torch.tensor([3, 7]), torch.tensor([1, 0, 0, 1]), 1)
    run_steps(tables, "cpu", steps=2, batches=[b, b])


@pytest.mark.parametrize("dtype,sr", [("fp32", False), ("fp16", True)])
def test_invalid_ids_unchecked(dtype, sr):
    """validate=False: ids < 0 or >= rows contribute zero, get no update, never crash."""
    tables = make_tables("adagrad", dtype, sr, "mean")
    gen = torch.Generator().manual_seed(5)
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False)
    fast = TableBatchedEmbedding(tables, backend="cpu", validate=False)
    clone_weights(ref, fast)
    for step in range(3):
        batch = random_batch(tables, 16, gen, weighted=True, long_bag=20)
        values = batch.values.clone()
        bad = torch.rand(values.numel(), generator=gen) < 0.25
        junk = torch.tensor([-1, -(2 ** 40), 100, 10 ** 6, 2 ** 62, 40, 30])
        values[bad] = junk[torch.randint(0, len(junk), (int(bad.sum()),), generator=gen)]
        batch = KeyedJaggedBatch(batch.keys, values, batch.lengths, batch.batch_size, weights=batch.weights)
        out_ref, out_fast = ref(batch), fast(batch)
        torch.testing.assert_close(out_fast, out_ref, rtol=1e-5, atol=1e-6)
        # the kernel counts what it skipped (last group = the only group here)
        offs = batch.offsets
        limit = torch.repeat_interleave(torch.tensor([40, 40, 30, 100]), offs[::16][1:] - offs[::16][:-1])
        expected_bad = int(((values < 0) | (values >= limit)).sum())
        assert fast.backend.last_invalid_count == expected_bad
        grad = torch.randn(out_ref.shape, generator=gen)
        out_ref.backward(grad)
        out_fast.backward(grad)
        assert fast.backend.last_invalid_count == expected_bad
        for t in tables:
            wa, wb = ref.table_weight(t.name), fast.table_weight(t.name)
            if dtype == "fp32":
                torch.testing.assert_close(wb, wa, rtol=1e-5, atol=1e-6)
            else:
                assert int(ulp_diff(wa, wb).max()) <= 1


def _train(tables, batches, grads, threads):
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        emb = TableBatchedEmbedding(tables, backend="cpu", seed=7)
        outs = []
        for b, g in zip(batches, grads):
            out = emb(b)
            outs.append(out.detach().clone())
            out.backward(g)
        return outs, [emb.table_weight(t.name).clone() for t in tables], \
            [s.clone() for t in tables for s in emb.table_optimizer_state(t.name).values()]
    finally:
        torch.set_num_threads(prev)


@pytest.mark.parametrize("opt,dtype", [("rowwise_adagrad", "fp32"), ("adam", "fp16"), ("lamb", "bf16")])
def test_threads_bit_identical(opt, dtype):
    """Big enough (~80k ids) that every phase splits across threads; results must not depend on it."""
    tables = [TableConfig(f"t{i}", 2000, d, feature_names=(f"f{i}a", f"f{i}b"), pooling=p, dtype=dtype,
                          optimizer=OptimizerConfig(opt, lr=0.05, weight_decay=0.01))
              for i, (d, p) in enumerate([(4, "sum"), (12, "mean"), (64, "sum"), (36, "mean")])]
    gen = torch.Generator().manual_seed(11)
    batches = [random_batch(tables, 512, gen, max_len=40, weighted=True, hot_fraction=0.5) for _ in range(2)]
    dim = sum(t.dim * len(t.feature_names) for t in tables)
    grads = [torch.randn(512, dim, generator=gen) for _ in batches]
    a = _train(tables, batches, grads, 1)
    b = _train(tables, batches, grads, 2)
    for x, y in zip(sum(a, []), sum(b, [])):
        assert torch.equal(x, y)


def test_large_table_segment_matches_reference_on_any_threads():
    """The backward sorts each table's ids alone (csrc/kernels/radix_sort.h): a table past 256k ids
    a step sorts on every thread, the small ones beside it one a thread. Against the reference,
    at 1 and 2 threads, bit for bit between the two and with the sort's write prefetches on and off
    (whichever is this CPU's default: off on AMD Zen 5)."""
    opt = OptimizerConfig("adagrad", lr=0.05)
    tables = [TableConfig("small", 300, 8, feature_names=("a", "b"), optimizer=opt),
              TableConfig("big", 5000, 16, optimizer=opt),
              TableConfig("tiny", 3, 4, optimizer=opt)]
    gen = torch.Generator().manual_seed(3)
    B = 64
    lengths = torch.cat([torch.randint(0, 9, (2 * B,), generator=gen),           # a, b
                         torch.full((B,), 4200),                                 # big: 268,800 ids
                         torch.randint(0, 3, (B,), generator=gen)])
    rows = [300] * 2 * B + [5000] * B + [3] * B
    values = torch.cat([torch.randint(0, r, (int(n),), generator=gen) for r, n in zip(rows, lengths)])
    batch = KeyedJaggedBatch(("a", "b", "big", "tiny"), values, lengths, B)
    grad = torch.randn(B, 8 + 8 + 16 + 4, generator=gen)
    run_steps(tables, "cpu", steps=1, batches=[batch])
    one = _train(tables, [batch], [grad], 1)
    two = _train(tables, [batch], [grad], 2)
    try:
        _C._set_tuning(sort_prefetch=1)
        prefetched = _train(tables, [batch], [grad], 2)
        _C._set_tuning(sort_prefetch=0)
        plain = _train(tables, [batch], [grad], 2)
    finally:
        _C._set_tuning()   # this CPU's defaults
    for x, y, z, w in zip(sum(one, []), sum(two, []), sum(prefetched, []), sum(plain, [])):
        assert torch.equal(x, y) and torch.equal(x, z) and torch.equal(x, w)


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_learning_rate_change(opt):
    tables = make_tables(opt, "fp32", False, "sum")
    ref = TableBatchedEmbedding(tables, backend="reference")
    fast = TableBatchedEmbedding(tables, backend="cpu")
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(2)
    for step, lr in enumerate([0.05, 0.2, 0.0, 0.01]):
        ref.set_learning_rate(lr)
        fast.set_learning_rate(lr)
        batch = random_batch(tables, 8, gen)
        out_ref, out_fast = ref(batch), fast(batch)
        grad = torch.randn(out_ref.shape, generator=gen)
        out_ref.backward(grad)
        out_fast.backward(grad)
        for t in tables:
            torch.testing.assert_close(fast.table_weight(t.name), ref.table_weight(t.name), rtol=1e-5, atol=1e-6)
            for k, v in ref.table_optimizer_state(t.name).items():
                torch.testing.assert_close(fast.table_optimizer_state(t.name)[k], v, rtol=1e-5, atol=1e-6)
    assert fast.optimizer_steps() == ref.optimizer_steps()


def test_two_groups_and_eval_mode():
    """Tables of different dtypes form two groups (two kernel calls); eval mode does no update."""
    o = OptimizerConfig("adagrad", lr=0.1)
    tables = [TableConfig("a", 50, 8, optimizer=o), TableConfig("b", 60, 16, dtype="bf16", optimizer=o),
              TableConfig("c", 70, 4, optimizer=o, pooling="mean")]
    run_steps(tables, "cpu", steps=2)   # fp32 within 1e-5; the bf16 group exact (module docstring)
    emb = TableBatchedEmbedding(tables, backend="cpu").eval()
    before = emb.table_weight("a").clone()
    with torch.no_grad():
        emb(random_batch(tables, 4, torch.Generator().manual_seed(0)))
    assert torch.equal(before, emb.table_weight("a"))


def test_auto_backend_is_cpu():
    assert TableBatchedEmbedding([TableConfig("a", 5, 4)]).backend_name == "cpu"


def test_hugepage_advice_is_harmless():
    from neo import _C
    t = torch.arange(3 << 20, dtype=torch.float32)   # 12 MiB: some 2 MiB-aligned interior
    _C.advise_hugepages(t)                             # best effort: True or False, never an error
    assert torch.equal(t, torch.arange(3 << 20, dtype=torch.float32))
    assert _C.advise_hugepages(torch.empty(0)) is False


def test_validation_through_kernel_count_names_feature_and_table():
    """The cpu backend's forward counts invalid ids; the module then names the culprit."""
    from neo.embedding import EmbeddingInputError

    tables = [TableConfig("a", 6, 4), TableConfig("b", 5, 8, feature_names=("b1", "b2"))]
    emb = TableBatchedEmbedding(tables, backend="cpu")
    assert emb.backend.counts_invalid_ids
    bags = {"a": [[1], [2]], "b1": [[0], []], "b2": [[4], [3, 5]]}
    with pytest.raises(EmbeddingInputError, match=r"feature 'b2' \(table 'b'\): id 5 at sample 1 is out of range \[0, 5\)"):
        emb(KeyedJaggedBatch.from_lists(bags))
    bags["b2"] = [[4], [3, -2]]
    with pytest.raises(EmbeddingInputError, match=r"feature 'b2' \(table 'b'\): id -2"):
        emb(KeyedJaggedBatch.from_lists(bags))
    bags["b2"] = [[4], [3, 1]]
    assert emb(KeyedJaggedBatch.from_lists(bags)).shape == (2, 20)


@pytest.mark.parametrize("bad_id", [False, True], ids=["by_table", "whole_range"])
def test_three_digit_sort_of_a_table_past_2_24_rows(bad_id):
    """Keys of 25 bits sort in three radix passes (csrc/kernels/radix_sort.h): the counting of the
    first two passes' digits in one read, the third alone. One table of 2^24 + 5 rows, ids over
    all of it (the top rows too, and repeats), at 1 and 2 threads against the reference. An id
    out of range sends the group down the whole-range sort (the sentinel key past every row)."""
    rows = (1 << 24) + 5
    tables = [TableConfig("huge", rows, 4, optimizer=OptimizerConfig("sgd", lr=0.5))]
    gen = torch.Generator().manual_seed(4)
    B = 256
    lengths = torch.randint(100, 300, (B,), generator=gen)
    n = int(lengths.sum())
    values = torch.randint(0, rows, (n,), generator=gen)
    q = n // 4
    values[:q] = values[q: 2 * q]                                   # repeats, far apart in the batch
    values[-3:] = torch.tensor([rows - 1, rows - 5, 1 << 24])
    if bad_id:
        values[7] = rows
    batch = KeyedJaggedBatch(("huge",), values, lengths, B)
    grad = torch.randn(B, 4, generator=gen)
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False)
    fast = TableBatchedEmbedding(tables, backend="cpu", validate=False)
    clone_weights(ref, fast)
    start = ref.table_weight("huge").clone()
    ref(batch).backward(grad)
    expected = ref.table_weight("huge")
    prev = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fast.table_weight("huge").copy_(start)                      # SGD: the weights are all the state
            fast(batch).backward(grad)
            assert fast.backend.last_invalid_count == int(bad_id)
            assert torch.equal(fast.table_weight("huge"), expected), f"{threads} threads"
    finally:
        torch.set_num_threads(prev)
