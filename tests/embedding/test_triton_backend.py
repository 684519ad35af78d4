"""The triton backend against the reference oracle, step by step.

Without a GPU the kernels run in Triton's interpreter on CPU tensors. ``TRITON_INTERPRET=1``
must be in the environment before triton decorates the kernels (``@triton.jit`` picks the
compiled or the interpreted implementation when the kernel module is imported, and
triton.language's own helpers when triton is imported), so tests/conftest.py sets it before
collection. With CUDA, the kernels are compiled and run on "cuda".
The interpreter is slow: shapes here are tiny (the file runs in well under 90 s on 2 cores).

Tolerances: fp32 compares at 1e-5 relative (forward pools in a different order than the
reference). fp16/bf16 weights compare bit for bit, with stochastic rounding on and off,
for sgd, adagrad and adam, whose updates are elementwise: the kernel uses IEEE division and
square root, the reference's evaluation order and no FMA contraction. rowwise_adagrad
(mean of g*g over the row) and lamb (row norms) reduce across the row, and a reduction
order cannot match torch's vectorised CPU reduction: their fp32 results can differ in the
last bit, which can move a 16-bit weight by one ulp (or flip a stochastic-rounding choice,
also one ulp). Those two allow <= 1 ulp on a small share of elements, and more only where an
update nearly cancels its weight (harness.assert_16bit_update_close, the CPU backend's rule);
modules are re-synchronised after every step so differences do not compound.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch

import triton  # noqa: F401  (a core dependency: missing must fail, not skip)

from neo.config.embedding import OptimizerConfig, TableConfig, WeightDType
from neo.embedding import TableBatchedEmbedding
from neo.embedding.checks import EmbeddingInputError
from neo.sparse import KeyedJaggedBatch
from tests.embedding.harness import assert_16bit_update_close, clone_weights, random_batch, run_steps, ulp_diff
from tests.multiprocess import ROOT, child_env
from neo.embedding.backends.reference import round_weights, sr_uniform
import triton.language as tl
from neo.embedding.backends import triton_kernels as tk

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OPTS = ["sgd", "adagrad", "rowwise_adagrad", "adam", "lamb"]
ELEMENTWISE = {"sgd", "adagrad", "adam"}


def make_tables(opt: str, dtype: str = "fp32", sr: bool = False, wd: float = 0.0):
    """Mixed dims 4 / 12 / 36, sum and mean pooling, one table read by two features."""
    o = OptimizerConfig(opt, lr=0.05, weight_decay=wd, initial_accumulator_value=0.1 if "adagrad" in opt else 0.0)
    common = dict(optimizer=o, dtype=dtype, stochastic_rounding=sr)
    return [
        TableConfig("a", num_rows=11, dim=4, **common),
        TableConfig("b", num_rows=7, dim=12, feature_names=("b1", "b2"), pooling="mean", **common),
        TableConfig("c", num_rows=5, dim=36, **common),
    ]


# ------------------------------------------------------------------------ helpers
def train_and_compare(tables, batches, exact=True, validate=True, seed=0, state_rtol=1e-5):
    """Like harness.run_steps, but 16-bit weights compare bit for bit (``exact``) or by the
    row-reducing optimizers' rule (see the module docstring), and the modules are re-synchronised
    after each step."""
    ref = TableBatchedEmbedding(tables, backend="reference", seed=seed, validate=validate)
    fast = TableBatchedEmbedding(tables, backend="triton", seed=seed, device=DEVICE, validate=validate)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(seed + 7)
    for step, batch in enumerate(batches):
        before = {t.name: ref.table_weight(t.name).float() for t in tables}      # copies (16-bit storage)
        out_ref = ref(batch)
        out_fast = fast(batch.to(DEVICE))
        torch.testing.assert_close(out_fast.cpu(), out_ref, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step} forward: {m}")
        grad = torch.randn(out_ref.shape, generator=gen)
        out_ref.backward(grad)
        out_fast.backward(grad.to(DEVICE))
        for t in tables:
            wr, wf = ref.table_weight(t.name), fast.table_weight(t.name).cpu()
            if t.dtype is WeightDType.FP32:
                torch.testing.assert_close(wf, wr, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step} {t.name}: {m}")
            elif exact:
                ulp = int(ulp_diff(wf, wr).max())
                assert ulp == 0, f"step {step} table {t.name}: weights differ by {ulp} ulp"
            else:                        # the row-reducing optimizers: harness.assert_16bit_update_close's rule
                assert_16bit_update_close(ref, t, step + 1, before[t.name], wr, wf, f"step {step} table {t.name}")
            sr_, sf = ref.table_optimizer_state(t.name), fast.table_optimizer_state(t.name)
            for k in sr_:
                if exact:
                    assert torch.equal(sf[k].cpu(), sr_[k]), f"step {step} table {t.name} state {k} not bit-exact"
                else:
                    torch.testing.assert_close(sf[k].cpu(), sr_[k], rtol=state_rtol, atol=1e-7)
        # re-synchronise: one-ulp differences must not compound
        clone_weights(ref, fast)
        for t in tables:
            for k, v in ref.table_optimizer_state(t.name).items():
                fast.table_optimizer_state(t.name)[k].copy_(v)


def _batches(tables, n=2, batch_size=6, weighted=False, long_bag=0, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [random_batch(tables, batch_size, gen, weighted=weighted, long_bag=long_bag) for _ in range(n)]


@triton.jit
def _round_probe(x_ptr, elem_ptr, u_ptr, bits_ptr, key, WKIND: tl.constexpr, SR: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i)
    e = tl.load(elem_ptr + i)
    key64 = key.to(tl.int64).to(tl.uint64, bitcast=True)
    tl.store(u_ptr + i, tk._sr_uniform(key64, e))
    tl.store(bits_ptr + i, tk._round_to_storage(x, e, key64, WKIND, SR))


# ------------------------------------------------------------------------ tests
@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy: inf - inf, nan on the edge values
@pytest.mark.parametrize("dtype", [WeightDType.FP16, WeightDType.BF16])
@pytest.mark.parametrize("seed,step", [(0, 1), (7, 3), (2**63 + 5, 2**20)])
def test_hash_and_rounding_helpers_match_reference(dtype, seed, step):
    """The in-kernel splitmix64 (uint64) and 16-bit rounding, on edge values and huge indices."""
    xs = [0.1, -0.1, 1 / 3, -2.7183, 1e-6, 300.123, 65504.0, 65519.9, 70000.0, float("inf"), float("-inf"),
          float("nan"), 0.0, -0.0, 1e-8, 5.96e-8, -3e-8, 3.0e38, 3.4e38, -1e-40, 1.0, 1 + 2**-12, 2.5e-3, -7.77]
    elems = [0, 1, 2, 12345, 2**31 + 7, 2**32 - 1, 2**40 + 3, 2**62 + 11]
    n = 32
    x = torch.tensor((xs * 2)[:n], dtype=torch.float32, device=DEVICE)
    e = torch.tensor((elems * 4)[:n], dtype=torch.int64, device=DEVICE)
    u = torch.empty(n, dtype=torch.float32, device=DEVICE)
    bits = torch.empty(n, dtype=torch.int32, device=DEVICE)
    key = ((seed & (2**64 - 1)) ^ ((step * 0x9E3779B97F4A7C15) & (2**64 - 1)))
    key = key - 2**64 if key >= 2**63 else key
    for sr in (False, True):
        _round_probe[(1,)](x, e, u, bits, key, WKIND=1 if dtype is WeightDType.FP16 else 2, SR=sr, BLOCK=n)
        u_ref = sr_uniform(seed, step, e.cpu())
        assert torch.equal(u.cpu(), u_ref)
        want = round_weights(x.cpu(), dtype, sr, u_ref)
        got = bits.cpu().to(torch.int16).view(dtype.torch_dtype)
        same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
        assert bool(same.all()), f"sr={sr}: {x.cpu()[~same]} -> {got[~same]} want {want[~same]}"


@pytest.mark.parametrize("wd,weighted", [(0.0, False), (0.01, True)])
@pytest.mark.parametrize("opt", OPTS)
def test_fp32_matches_reference(opt, wd, weighted):
    run_steps(make_tables(opt, wd=wd), "triton", steps=2, batch_size=6, weighted=weighted, device=DEVICE)


@pytest.mark.parametrize("sr", [False, True])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("opt", OPTS)
def test_16bit_weights_bit_exact(opt, dtype, sr):
    tables = make_tables(opt, dtype=dtype, sr=sr, wd=0.01 if opt in ("adam", "lamb") else 0.0)
    exact = opt in ELEMENTWISE
    train_and_compare(tables, _batches(tables, weighted=True), exact=exact, seed=3)


def test_stochastic_rounding_large_seed_and_long_bags():
    """A seed above 2^63 (uint64 hash paths), long bags (several id tiles) and hot rows."""
    tables = make_tables("adagrad", dtype="bf16", sr=True)
    train_and_compare(tables, _batches(tables, n=2, batch_size=4, long_bag=40), seed=2**63 + 5)


def test_long_bags_fp32():
    run_steps(make_tables("rowwise_adagrad"), "triton", steps=2, batch_size=4, long_bag=70, device=DEVICE)


def test_duplicates_shared_table_and_empty_bags():
    tables = make_tables("adam")
    batch = KeyedJaggedBatch.from_lists(
        {
            "a": [[3, 3, 3], [], [3, 0]],
            "b1": [[1, 1], [6], []],
            "b2": [[], [1, 6, 1], [6]],        # table b read by b1 and b2: rows 1 and 6 shared
            "c": [[], [], []],                 # feature with only empty bags
        },
        weights={"a": [[1.0, 0.5, 2.0], [], [1.5, 1.0]], "b1": [[1.0, 3.0], [0.25], []],
                 "b2": [[], [1.0, 2.0, 0.5], [4.0]], "c": [[], [], []]},
    )
    run_steps(tables, "triton", batches=[batch, batch], steps=2, device=DEVICE)


def test_all_empty_batch():
    tables = make_tables("lamb")
    keys = [f for t in tables for f in t.feature_names]
    empty = KeyedJaggedBatch.from_lists({k: [[], [], []] for k in keys})
    full = random_batch(tables, 3, torch.Generator().manual_seed(0))
    run_steps(tables, "triton", batches=[empty, full, empty], steps=3, device=DEVICE)


def test_batch_of_one_and_single_row_table():
    """B = 1 and a 1-row table (ints equal to 1 are specialised as constants by triton)."""
    o = OptimizerConfig("adam", lr=0.05)
    tables = [TableConfig("one", num_rows=1, dim=8, optimizer=o, pooling="mean"),
              TableConfig("x", num_rows=9, dim=4, optimizer=o, feature_names=("x1", "x2"))]
    batch = KeyedJaggedBatch.from_lists({"one": [[0, 0, 0]], "x1": [[8, 1, 8]], "x2": [[]]})
    run_steps(tables, "triton", batches=[batch, batch], steps=2, device=DEVICE)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_invalid_ids_unchecked(dtype):
    """validate=False: ids < 0 or >= rows contribute zero and get no update (no OOB access)."""
    tables = make_tables("adagrad", dtype=dtype, sr=True)
    batch = KeyedJaggedBatch.from_lists(
        {
            "a": [[-1, 2, 11], [2**40], [10, 10, -5]],
            "b1": [[7, 1], [-2**62], []],
            "b2": [[6, 100], [], [0]],
            "c": [[5], [4, 5, 2**31], [-1]],
        },
        weights={"a": [[1.0, 1.0, 1.0], [1.0], [1.0, 2.0, 1.0]], "b1": [[1.0, 1.0], [1.0], []],
                 "b2": [[1.0, 1.0], [], [1.0]], "c": [[1.0], [1.0, 1.0, 1.0], [1.0]]},
    )
    all_bad = KeyedJaggedBatch.from_lists({"a": [[-1], [11]], "b1": [[7, 7], []], "b2": [[-3], []], "c": [[], [99]]})
    train_and_compare(tables, [batch, all_bad, batch], validate=False)


def test_eval_forward_only():
    tables = make_tables("sgd")
    ref = TableBatchedEmbedding(tables, backend="reference")
    fast = TableBatchedEmbedding(tables, backend="triton", device=DEVICE)
    clone_weights(ref, fast)
    batch = random_batch(tables, 5, torch.Generator().manual_seed(2), weighted=True)
    with torch.no_grad():
        torch.testing.assert_close(fast(batch.to(DEVICE)).cpu(), ref(batch), rtol=1e-5, atol=1e-6)


def test_weight_grad_equals_the_reference():
    """Per-id weights that require grad get the reference backend's gradient (test_weight_grad.py
    checks that one against plain PyTorch), in training and in eval mode."""
    tables = make_tables("sgd")
    ref = TableBatchedEmbedding(tables, backend="reference")
    fast = TableBatchedEmbedding(tables, backend="triton", device=DEVICE)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(4)
    for train in (True, False):
        batch = random_batch(tables, 5, gen, weighted=True)
        grad = torch.randn(5, ref.output_dim, generator=gen)
        grads = []
        for m, dev in ((ref, "cpu"), (fast, DEVICE)):
            m.train(train)
            b = batch.to(dev)
            b.weights = b.weights.detach().clone().requires_grad_()          # a leaf of each module's own
            m(b).backward(grad.to(dev))
            grads.append(b.weights.grad.cpu())
        assert grads[0].abs().sum() > 0
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6, msg=lambda m: f"train={train}: {m}")


def test_import_neo_does_not_import_triton():
    code = (
        "import sys, neo, neo.embedding, neo.embedding.backends.triton as tb\n"
        "assert 'triton' not in sys.modules, 'triton imported eagerly'\n"
        "assert tb.TritonBackend.name == 'triton'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=child_env())


# ------------------------------------------------------------------------ unpooled lookups
@pytest.mark.parametrize("opt", ["sgd", "rowwise_adagrad", "adam"])
def test_sequence_lookup_equals_the_reference(opt):
    """emb.sequence through the triton kernels (bags of one under a one-feature view of the
    group): every id's row, then the tables and state after each step's fused update, as the
    reference backend's (which tests/embedding/test_sequence.py checks against torch.optim)."""
    tables = make_tables(opt)
    ref = TableBatchedEmbedding(tables, backend="reference", seed=0)
    fast = TableBatchedEmbedding(tables, backend="triton", seed=0, device=DEVICE)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(11)
    for step, batch in enumerate(_batches(tables, n=2, long_bag=5)):
        seq_ref, seq_fast = ref.sequence(batch), fast.sequence(batch.to(DEVICE))
        assert list(seq_fast) == list(seq_ref)
        grads = {}
        for f, s in seq_ref.items():
            # the same rows bit for bit before any update; afterwards row-wise reductions may differ
            # in the last bit (module docstring)
            tol = dict(rtol=0, atol=0) if step == 0 else dict(rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(seq_fast[f].values.cpu(), s.values, **tol,
                                       msg=lambda m: f"step {step} feature {f}: {m}")
            grads[f] = torch.randn(s.values.shape, generator=gen)
        sum((s.values * grads[f]).sum() for f, s in seq_ref.items()).backward()
        sum((s.values * grads[f].to(DEVICE)).sum() for f, s in seq_fast.items()).backward()
        for t in tables:
            torch.testing.assert_close(fast.table_weight(t.name).cpu(), ref.table_weight(t.name), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"step {step} table {t.name}: {m}")
            for k, v in ref.table_optimizer_state(t.name).items():
                torch.testing.assert_close(fast.table_optimizer_state(t.name)[k].cpu(), v, rtol=1e-5, atol=1e-7,
                                           msg=lambda m: f"step {step} table {t.name} state {k}: {m}")


@pytest.fixture
def no_torch_count(monkeypatch):
    """The module's pass of torch operations over the ids (count_bad_ids) made to fail: what is
    counted, the triton kernel counted."""
    import neo.embedding.invalid_ids as invalid_ids

    def no_torch_pass(*args, **kwargs):
        raise AssertionError("count_bad_ids called: the triton forward should have counted")

    monkeypatch.setattr(invalid_ids, "count_bad_ids", no_torch_pass)


@pytest.fixture
def id_check_calls(monkeypatch):
    """The module's id check (check_ids), each call recorded in the returned list."""
    import neo.embedding.invalid_ids as invalid_ids

    calls, real_check = [], invalid_ids.check_ids

    def counting_check(*args, **kwargs):
        calls.append(1)
        return real_check(*args, **kwargs)

    monkeypatch.setattr(invalid_ids, "check_ids", counting_check)
    return calls


def _mixed_group_tables():
    """Two groups (fp32 and fp16 weights), one table read by two features."""
    o = OptimizerConfig("adagrad", lr=0.05)
    return [TableConfig("a", num_rows=10, dim=4, optimizer=o),
            TableConfig("h", num_rows=6, dim=8, optimizer=o, dtype="fp16", feature_names=("h1", "h2")),
            TableConfig("c", num_rows=7, dim=12, optimizer=o)]


def _batch_with_bad_ids(gen, rows, batch_size=5, max_len=12):
    """Bags of 0 .. max_len ids drawn from [-3, rows + 3): some out of range, some bags longer than a tile."""
    return {f: [torch.randint(-3, n + 3, (int(k),), generator=gen).tolist()
                for k in torch.randint(0, max_len + 1, (batch_size,), generator=gen)] for f, n in rows.items()}


MIXED_ROWS = {"a": 10, "h1": 6, "h2": 6, "c": 7}
MIXED_TABLE_OF = {"a": "a", "h1": "h", "h2": "h", "c": "c"}


def _add_invalid(want, lists):
    """Add each table's ids outside [0, rows) in ``lists`` to ``want`` (the oracle of skipped_ids)."""
    for f, bags in lists.items():
        want[MIXED_TABLE_OF[f]] += sum(1 for bag in bags for i in bag if not 0 <= i < MIXED_ROWS[f])


def test_validate_off_counts_skipped_ids_in_the_kernel(no_torch_count):
    """validate=False: the forward kernel counts each feature's invalid ids (no pass of torch
    operations over the ids: count_bad_ids is never called), the counts per table equal a count of
    the lists, and the output equals the reference backend's, in training and under no_grad."""
    tables = _mixed_group_tables()
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False, count_skipped=False)
    fast = TableBatchedEmbedding(tables, backend="triton", device=DEVICE, validate=False)
    assert len(fast.groups) == 2
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(5)
    want = {"a": 0, "h": 0, "c": 0}
    for step in range(3):
        lists = _batch_with_bad_ids(gen, MIXED_ROWS)
        _add_invalid(want, lists)
        batch = KeyedJaggedBatch.from_lists(lists)
        if step == 1:
            with torch.no_grad():
                torch.testing.assert_close(fast(batch.to(DEVICE)).cpu(), ref(batch), rtol=1e-5, atol=1e-6)
        else:
            out_ref, out_fast = ref(batch), fast(batch.to(DEVICE))
            torch.testing.assert_close(out_fast.cpu(), out_ref, rtol=1e-5, atol=1e-6)
            grad = torch.randn(out_ref.shape, generator=gen)
            out_ref.backward(grad)
            out_fast.backward(grad.to(DEVICE))
        assert fast.skipped_ids == want, f"step {step}"
    assert all(v > 0 for v in want.values())


def test_validated_lookup_checks_the_kernels_counts(id_check_calls):
    """validate=True: a good batch costs no id check of its own (the kernel's counts are read once);
    an id out of range raises naming its feature, table and sample, whichever group it is in."""
    calls = id_check_calls
    fast = TableBatchedEmbedding(_mixed_group_tables(), backend="triton", device=DEVICE)
    good = {"a": [[1, 9], [0]], "h1": [[5], []], "h2": [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3]], "c": [[6], [0, 6]]}
    good = {f: bags + [[]] * (2 - len(bags)) for f, bags in good.items()}
    fast(KeyedJaggedBatch.from_lists(good).to(DEVICE)).sum().backward()
    assert calls == []
    for feature, table, bad_id in (("h2", "h", 6), ("c", "c", -1), ("a", "a", 10)):
        lists = {f: [list(b) for b in bags] for f, bags in good.items()}
        lists[feature][1] = lists[feature][1] + [bad_id]
        with pytest.raises(EmbeddingInputError, match=rf"feature '{feature}' \(table '{table}'\): id {bad_id} "
                                                       r"at sample 1 is out of range"):
            fast(KeyedJaggedBatch.from_lists(lists).to(DEVICE))
    assert len(calls) == 3          # once per bad batch, to name the id


def test_sequence_lookup_counts_skipped_ids_in_the_kernel(no_torch_count):
    """Unpooled lookups with validate=False: each table's invalid ids counted by the kernel (no
    count_bad_ids pass), per table equal to a count of the lists, pooled and unpooled counts
    adding up; the rows equal the reference backend's (zeros for the invalid ids), with and
    without autograd."""
    tables = _mixed_group_tables()
    ref = TableBatchedEmbedding(tables, backend="reference", validate=False, count_skipped=False)
    fast = TableBatchedEmbedding(tables, backend="triton", device=DEVICE, validate=False)
    clone_weights(ref, fast)
    gen = torch.Generator().manual_seed(8)
    want = {"a": 0, "h": 0, "c": 0}
    for step in range(3):
        lists = _batch_with_bad_ids(gen, MIXED_ROWS, max_len=6)
        _add_invalid(want, lists)
        batch = KeyedJaggedBatch.from_lists(lists)
        with torch.no_grad() if step == 1 else contextlib.nullcontext():
            seq_ref, seq_fast = ref.sequence(batch), fast.sequence(batch.to(DEVICE))
            for f in lists:
                torch.testing.assert_close(seq_fast[f].values.cpu(), seq_ref[f].values, rtol=1e-5, atol=1e-6)
        if step != 1:
            sum(s.values.sum() for s in seq_ref.values()).backward()
            sum(s.values.sum() for s in seq_fast.values()).backward()
        assert fast.skipped_ids == want, f"step {step}"
    fast(KeyedJaggedBatch.from_lists(lists).to(DEVICE))             # the pooled lookup adds its own
    _add_invalid(want, lists)
    assert fast.skipped_ids == want and all(v > 0 for v in want.values())


def test_validated_sequence_lookup_checks_the_kernels_counts(id_check_calls):
    """Unpooled lookups with validation: no id check of their own on a good batch; a bad id
    raises naming feature, table and sample, and no table changes."""
    calls = id_check_calls
    fast = TableBatchedEmbedding(_mixed_group_tables(), backend="triton", device=DEVICE)
    before = {t: fast.table_weight(t).clone() for t in ("a", "h", "c")}
    good = {"a": [[1, 9], [0]], "h1": [[5], []], "h2": [[0, 1], [2, 3, 4, 5]], "c": [[6], [0, 6]]}
    with torch.no_grad():
        fast.sequence(KeyedJaggedBatch.from_lists(good).to(DEVICE))
    assert calls == []
    bad = dict(good, h2=[[0, 1], [2, 6]])
    with pytest.raises(EmbeddingInputError, match=r"feature 'h2' \(table 'h'\): id 6 at sample 1 is out of range"):
        fast.sequence(KeyedJaggedBatch.from_lists(bad).to(DEVICE))
    assert len(calls) == 1
    for t, w in before.items():
        assert torch.equal(fast.table_weight(t), w), t
