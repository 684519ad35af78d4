"""Bad id batches, fuzzed, through ``KeyedJaggedBatch`` and ``TableBatchedEmbedding`` (issue 17, item 5).

Batches over the features of three tables in three kernel groups (adagrad fp32, row-wise
Adagrad with mean pooling and two features, Adam fp16), on the ``reference`` and ``cpu``
backends, in training mode: negative ids, ids at or past the rows, huge ids (2**62, 2**63 - 1,
-2**63), int32 ids, lengths whose sum misses the ids or wraps int64, negative lengths, given
offsets that are ragged, decreasing or of the wrong size, a wrong batch size, ids or lengths of
the wrong dtype or shape, empty batches, per-id weights of the wrong shape or dtype, missing,
extra, repeated or non-string keys, non-contiguous ids, bad ``pooled_bags``; batches built
with and without their own validation.

Property: a plain-Python oracle of the documented rules says which error comes first
(layout: :class:`JaggedValidationError`; features, ``pooled_bags``, ids:
:class:`EmbeddingInputError`) and the module raises exactly that, naming the feature (and the
table of a bad id), with every table's weights, optimizer state and step counter bit-identical
to before; a good batch gives the oracle's pooled output, and its fused backward changes no
row the batch does not hold. Both backends behave alike.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import pytest
import torch
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from neo.config import OptimizerConfig, TableConfig
from neo.embedding import EmbeddingInputError, TableBatchedEmbedding
from neo.sparse import JaggedValidationError, KeyedJaggedBatch

TABLES = [
    TableConfig("user", 13, 8, optimizer=OptimizerConfig("adagrad", lr=0.1)),
    TableConfig("item", 7, 4, feature_names=("item", "item_hist"), pooling="mean",
                optimizer=OptimizerConfig("rowwise_adagrad", lr=0.1)),
    TableConfig("geo", 5, 4, dtype="fp16", optimizer=OptimizerConfig("adam", lr=0.01)),
]
FEATURES = [f for t in TABLES for f in t.feature_names]
TABLE_OF = {f: t for t in TABLES for f in t.feature_names}
DIM = {f: TABLE_OF[f].dim for f in FEATURES}
OUT_DIM = sum(DIM.values())
BACKENDS = ("reference", "cpu")
HUGE_IDS = [-1, -2, -(2**31), 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -(2**63)]
FIELD_WORDS = ("values", "ids", "lengths", "offsets", "weights", "keys", "batch_size", "F * B")


# ----------------------------------------------------------------------------- strategies
def ids_of(feature: str):
    rows = TABLE_OF[feature].num_rows
    return st.one_of(*[st.integers(0, rows - 1)] * 15, st.sampled_from([rows, rows + 1] + HUGE_IDS))


@st.composite
def specs(draw) -> dict:
    """A batch as plain data, plus the corruption applied to it."""
    keys = list(draw(st.permutations(FEATURES)))
    key_mut = draw(st.sampled_from(["none"] * 20 + ["drop", "extra", "dup", "int_key", "str_keys"]))
    if key_mut == "drop":
        keys.pop(draw(st.integers(0, len(keys) - 1)))
    elif key_mut == "extra":
        keys.insert(draw(st.integers(0, len(keys))), draw(st.sampled_from(["zz", "User", "item "])))
    elif key_mut == "dup":
        keys.insert(draw(st.integers(0, len(keys))), draw(st.sampled_from(keys)))
    B = draw(st.integers(0, 4))
    bags = [[draw(st.lists(ids_of(k) if k in TABLE_OF else ids_of("geo"), max_size=3)) for _ in range(B)]
            for k in keys]
    with_weights = draw(st.booleans())
    return dict(keys=keys, key_mut=key_mut, B=B, bags=bags, with_weights=with_weights,
                layout_mut=draw(st.sampled_from(["none"] * 16 + [
                    "length_off", "negative_length", "offsets", "offsets_bad", "offsets_start", "offsets_count",
                    "offsets_list", "wrap", "batch_size", "values_dtype", "lengths_dtype", "values_2d",
                    "weights_shape", "weights_dtype", "weights_f64", "weights_nan", "noncontig", "int32"])),
                mut_at=draw(st.integers(0, 10**6)), delta=draw(st.sampled_from([-2, -1, 1, 3])),
                bad_B=draw(st.sampled_from([-1, 1, 2.0, True, "2", None])),
                bad_dtype=draw(st.sampled_from([torch.float32, torch.int16, torch.uint8, torch.bool, torch.float64])),
                batch_validate=draw(st.booleans()),
                pooled=draw(st.sampled_from(["none"] * 8 + ["mask"] * 2 + ["bad_shape", "int", "list"])),
                seed=draw(st.integers(0, 3)))


def build(spec: dict):
    """(constructor kwargs, pooled_bags, the layout the oracle judges)."""
    keys, B, bags = list(spec["keys"]), spec["B"], spec["bags"]
    m, at = spec["layout_mut"], spec["mut_at"]
    flat = [i for fb in bags for bag in fb for i in bag]
    lengths = [len(bag) for fb in bags for bag in fb]
    gen = torch.Generator().manual_seed(spec["seed"])
    kw: dict = dict(keys=tuple(keys), batch_size=B)
    if spec["key_mut"] == "int_key" and keys:
        kw["keys"] = tuple(keys[:-1]) + (7,)
    if spec["key_mut"] == "str_keys":
        kw["keys"] = "".join(keys)
    vdtype = torch.int32 if m == "int32" else torch.int64
    if vdtype is torch.int32:
        flat = [i if -(2**31) <= i < 2**31 else -(2**31) for i in flat]
    values = torch.tensor(flat, dtype=vdtype)
    if m == "noncontig":                     # every other element of a tensor twice as long
        values = torch.stack([values, torch.full_like(values, 10**6)], 1).reshape(-1)[::2]
    if m == "values_dtype":
        values = values.to(spec["bad_dtype"])
    if m == "values_2d":
        values = values.reshape(1, -1)
    if m == "length_off" and lengths:
        lengths[at % len(lengths)] += spec["delta"]
    if m == "negative_length" and lengths:
        lengths[at % len(lengths)] = -1 - at % 3
    if m == "wrap" and len(lengths) >= 4:    # the sum wraps around int64 back to len(flat)
        lengths[:4] = [2**62] * 4
    kw["values"] = values
    kw["lengths"] = torch.tensor(lengths, dtype=spec["bad_dtype"] if m == "lengths_dtype" else torch.int64)
    cum = [0]
    for n in lengths:
        cum.append(cum[-1] + n)
    if m in ("offsets", "offsets_bad", "offsets_start", "offsets_count", "offsets_list") \
            and all(-(2**63) <= c < 2**63 for c in cum):
        offs = list(cum)
        if m == "offsets_bad" and len(offs) > 2:
            k = 1 + at % (len(offs) - 2)
            offs[k] = offs[k] + spec["delta"] * 5              # ragged: lengths disagree, maybe decreasing
        elif m == "offsets_start":
            offs = [o + 1 for o in offs]
        elif m == "offsets_count":
            offs = offs + [offs[-1]] if spec["delta"] > 0 else offs[:-1]
        kw["offsets"] = offs if m == "offsets_list" else torch.tensor(offs, dtype=torch.int64)
    if m == "batch_size":
        kw["batch_size"] = spec["bad_B"]
    if spec["with_weights"] or m.startswith("weights"):
        w = torch.rand(len(flat), generator=gen) + 0.5
        if m == "weights_shape":
            w = w[:-1] if len(flat) else torch.ones(1)
        elif m == "weights_dtype":
            w = (w * 4).to(torch.int64)
        elif m == "weights_f64":
            w = w.double()
        elif m == "weights_nan" and len(flat):
            w[at % len(flat)] = math.nan
        kw["weights"] = w
    n_bags = len(keys) * B
    pooled = None
    if spec["pooled"] == "mask":
        pooled = torch.rand(n_bags, generator=gen) < 0.6
    elif spec["pooled"] == "bad_shape":
        pooled = torch.ones(n_bags + 1, dtype=torch.bool)
    elif spec["pooled"] == "int":
        pooled = torch.ones(n_bags, dtype=torch.int64)
    elif spec["pooled"] == "list":
        pooled = [True] * n_bags
    return kw, pooled


# ----------------------------------------------------------------------------- the oracle
def layout_ok(kw: dict) -> bool:
    """The documented layout rules (neo/sparse.py), in plain Python with unbounded ints."""
    keys, B, v, ln = kw["keys"], kw["batch_size"], kw["values"], kw["lengths"]
    if isinstance(keys, str) or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        return False
    if not isinstance(B, int) or isinstance(B, bool) or B < 0:
        return False
    if v.dtype not in (torch.int32, torch.int64) or v.dim() != 1:
        return False
    if ln.dtype not in (torch.int32, torch.int64) or ln.dim() != 1 or ln.numel() != len(keys) * B:
        return False
    lengths = ln.tolist()
    if any(n < 0 for n in lengths):
        return False
    cum = [0]
    for n in lengths:
        cum.append(cum[-1] + n)
    if cum[-1] != v.numel():
        return False
    offs = kw.get("offsets")
    if offs is not None:
        if not isinstance(offs, torch.Tensor) or offs.tolist() != cum:
            return False
    w = kw.get("weights")
    if w is not None and (not w.is_floating_point() or tuple(w.shape) != tuple(v.shape)):
        return False
    return True


def first_problem(kw: dict, pooled) -> Optional[str]:
    """None for a good batch, else what the module must reject it for, in its order of checks."""
    if not layout_ok(kw):
        return "layout"
    keys = list(kw["keys"])
    if sorted(keys) != sorted(FEATURES):
        return "features"
    B = kw["batch_size"]
    if pooled is not None and (not isinstance(pooled, torch.Tensor) or pooled.dtype != torch.bool
                               or tuple(pooled.shape) != (len(keys) * B,)):
        return "pooled_bags"
    if bad_id_features(kw):
        return "ids"
    return None


def bad_id_features(kw: dict) -> List[str]:
    keys, B = list(kw["keys"]), kw["batch_size"]
    ids, lengths = kw["values"].tolist(), kw["lengths"].tolist()
    out, pos = [], 0
    for f, key in enumerate(keys):
        n = sum(lengths[f * B:(f + 1) * B])
        if any(not 0 <= i < TABLE_OF[key].num_rows for i in ids[pos:pos + n]):
            out.append(key)
        pos += n
    return out


def expected_output(emb: TableBatchedEmbedding, kw: dict, pooled) -> torch.Tensor:
    """(B, sum D) in the module's feature order: each bag's rows summed (times the per-id
    weights), divided by the bag's length under mean pooling; unpooled bags are zeros."""
    keys, B = list(kw["keys"]), kw["batch_size"]
    ids, lengths = kw["values"].tolist(), kw["lengths"].tolist()
    w = kw.get("weights")
    out = torch.zeros(B, OUT_DIM, dtype=torch.float64)
    pos = 0
    starts = {}
    for f, key in enumerate(keys):
        starts[key] = (f, pos)
        pos += sum(lengths[f * B:(f + 1) * B])
    col = 0
    for key in emb.feature_names:
        t = TABLE_OF[key]
        table = emb.table_weight(t.name).to(torch.float64)
        f, pos = starts[key]
        for b in range(B):
            n = lengths[f * B + b]
            for j in range(pos, pos + n):
                out[b, col:col + t.dim] += table[ids[j]] * (1.0 if w is None else float(w[j]))
            if t.pooling.value == "mean" and n:
                out[b, col:col + t.dim] /= n
            if pooled is not None and not bool(pooled[f * B + b]):
                out[b, col:col + t.dim] = 0
            pos += n
        col += t.dim
    return out


# ----------------------------------------------------------------------------- state
def snapshot(emb: TableBatchedEmbedding) -> Dict[str, torch.Tensor]:
    """Every buffer (weights, optimizer state, step counters), as raw bits."""
    return {n: b.detach().clone() for n, b in emb.named_buffers()}


def assert_bit_identical(before: Dict[str, torch.Tensor], emb: TableBatchedEmbedding, why: str) -> None:
    after = dict(emb.named_buffers())
    for name, b in before.items():
        a = after[name]
        same = torch.equal(b.view(torch.int16 if b.element_size() == 2 else torch.int32)
                           if b.is_floating_point() else b,
                           a.view(torch.int16 if a.element_size() == 2 else torch.int32)
                           if a.is_floating_point() else a)
        assert same, f"{name} changed after {why}"


def assert_untouched_rows_kept(before: TableBatchedEmbedding, emb: TableBatchedEmbedding, kw: dict) -> None:
    keys, B = list(kw["keys"]), kw["batch_size"]
    ids = kw["values"].tolist()
    lengths = kw["lengths"].tolist()
    touched: Dict[str, set] = {t.name: set() for t in TABLES}
    pos = 0
    for f, key in enumerate(keys):
        n = sum(lengths[f * B:(f + 1) * B])
        touched[TABLE_OF[key].name].update(ids[pos:pos + n])
        pos += n
    for t in TABLES:
        keep = torch.tensor([r not in touched[t.name] for r in range(t.num_rows)])
        w0, w1 = before[t.name]
        assert torch.equal(w0[keep], emb.table_weight(t.name)[keep]), f"table '{t.name}': an untouched row changed"
        for s, v in emb.table_optimizer_state(t.name).items():
            assert torch.equal(w1[s][keep], v[keep]), f"table '{t.name}': optimizer state {s} of an untouched row changed"


def names_it(msg: str, problem: str, kw: dict) -> bool:
    keys = kw["keys"] if not isinstance(kw["keys"], str) else ()
    quoted = any(f"'{k}'" in msg for k in list(keys) + FEATURES if isinstance(k, str))
    if problem == "layout":
        return quoted or any(w in msg for w in FIELD_WORDS)
    if problem == "features":
        return quoted
    if problem == "pooled_bags":
        return "pooled_bags" in msg
    return any(f"feature '{f}' (table '{TABLE_OF[f].name}')" in msg for f in bad_id_features(kw))


# ----------------------------------------------------------------------------- the property
def run(backend: str, spec: dict, emb: Optional[TableBatchedEmbedding] = None):
    """The outcome of one batch on a fresh module: ("rejected", exception type) or ("ok", output, module)."""
    kw, pooled = build(spec)
    problem = first_problem(kw, pooled)
    emb = emb or TableBatchedEmbedding(TABLES, backend=backend, seed=spec["seed"])
    before = snapshot(emb)
    # validate=False skips the checks, not the derivation of offsets from lengths (float lengths
    # fail there); string keys are refused either way
    validate = spec["batch_validate"] or spec["layout_mut"] == "lengths_dtype" or spec["key_mut"] == "str_keys"
    try:
        batch = KeyedJaggedBatch(**kw, validate=validate)
    except JaggedValidationError as e:
        assert validate and problem == "layout", f"{backend}: construction rejected a batch ({problem}): {e}"
        assert names_it(str(e), problem, kw), str(e)
        event("rejected at construction")
        return ("rejected", "layout")
    assert not (validate and problem == "layout"), f"{backend}: a batch with a bad layout was built: {kw}"
    try:
        out = emb(batch, pooled_bags=pooled)
    except (JaggedValidationError, EmbeddingInputError) as e:
        assert problem is not None, f"{backend}: a good batch was rejected: {e!r}"
        want = JaggedValidationError if problem == "layout" else EmbeddingInputError
        assert type(e) is want, f"{backend}: {problem} raised {type(e).__name__}: {e}"
        assert names_it(str(e), problem, kw), f"{backend}: the message does not name the {problem}: {e}"
        assert_bit_identical(before, emb, f"a rejected batch ({problem})")
        event(f"rejected by the module: {problem}")
        return ("rejected", problem)
    assert problem is None, f"{backend}: a bad batch ({problem}) was accepted"
    want = expected_output(emb, kw, pooled)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5, equal_nan=True)
    kept = {t.name: (emb.table_weight(t.name).clone(),
                     {s: v.clone() for s, v in emb.table_optimizer_state(t.name).items()}) for t in TABLES}
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(spec["seed"]))
    out.backward(grad)                       # the fused update of the rows the batch holds
    assert_untouched_rows_kept(kept, emb, kw)
    event("accepted and trained")
    return ("ok", out.detach(), emb)


@given(specs())
@example(dict(keys=FEATURES, key_mut="none", B=1, bags=[[[0]], [[1]], [[2]], [[3]]], with_weights=False,
              layout_mut="wrap", mut_at=0, delta=1, bad_B=1, bad_dtype=torch.float32, batch_validate=True,
              pooled="none", seed=0))
@example(dict(keys=FEATURES, key_mut="none", B=2, bags=[[[0], [1]], [[1], []], [[2], [3]], [[3], [4]]],
              with_weights=False, layout_mut="batch_size", mut_at=0, delta=1, bad_B=2.0,
              bad_dtype=torch.float32, batch_validate=True, pooled="none", seed=0))
@example(dict(keys=FEATURES, key_mut="none", B=2, bags=[[[0], [1]], [[1], []], [[2], [3]], [[3], [4]]],
              with_weights=False, layout_mut="offsets_bad", mut_at=0, delta=3, bad_B=2,
              bad_dtype=torch.float32, batch_validate=False, pooled="none", seed=0))
@example(dict(keys=FEATURES, key_mut="none", B=2, bags=[[[0], [1]], [[1], []], [[2], [3]], [[3], [4]]],
              with_weights=True, layout_mut="none", mut_at=0, delta=1, bad_B=2,
              bad_dtype=torch.float32, batch_validate=True, pooled="int", seed=0))
@example(dict(keys=FEATURES, key_mut="none", B=2, bags=[[[], []], [[], []], [[], []], [[], [5]]],   # cpu: an id
              with_weights=False, layout_mut="none", mut_at=0, delta=1, bad_B=2,          # out of range in
              bad_dtype=torch.float32, batch_validate=True, pooled="mask", seed=0))        # an unpooled bag
def test_bad_batches_are_named_and_change_no_table(spec):
    outcomes = [run(backend, spec) for backend in BACKENDS]
    assert [o[:2] if o[0] == "rejected" else o[0] for o in outcomes] == \
           [outcomes[0][:2] if outcomes[0][0] == "rejected" else "ok"] * len(BACKENDS)
    if outcomes[0][0] == "ok":              # both backends: the same pooled output, the same update
        (_, out_a, emb_a), (_, out_b, emb_b) = outcomes
        torch.testing.assert_close(out_a, out_b, rtol=1e-5, atol=1e-6, equal_nan=True)
        for t in TABLES:
            torch.testing.assert_close(emb_a.table_weight(t.name).float(), emb_b.table_weight(t.name).float(),
                                       rtol=1e-3, atol=1e-3, equal_nan=True)


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(st.lists(specs(), min_size=2, max_size=4), st.sampled_from(BACKENDS))
def test_a_training_run_survives_rejected_batches(specs_, backend):
    """One module through a sequence of batches: each rejected one leaves the tables as the
    previous step left them; each good one trains (the module stays usable)."""
    emb = TableBatchedEmbedding(TABLES, backend=backend, seed=1)
    for spec in specs_:
        run(backend, spec, emb)
    good = KeyedJaggedBatch.from_lists({f: [[0, 1], [2]] for f in FEATURES})
    assert emb(good).shape == (2, OUT_DIM)


def _module_ignoring_ids(backend: str) -> TableBatchedEmbedding:
    return TableBatchedEmbedding(TABLES, backend=backend, validate=False, seed=3)


@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(specs().filter(lambda s: s["key_mut"] == "none"))
def test_without_validation_bad_ids_count_zero_and_update_nothing(spec):
    """``validate=False``: ids outside a table contribute zero and are not updated (module doc)."""
    spec = dict(spec, layout_mut="none", pooled="none", batch_validate=True)
    kw, _ = build(spec)
    outs = []
    ref = TableBatchedEmbedding(TABLES, backend="reference", seed=3)      # the initial weights
    for backend in BACKENDS:
        emb = _module_ignoring_ids(backend)
        clean = dict(kw)
        keys, B = list(kw["keys"]), kw["batch_size"]
        ids = kw["values"].tolist()
        # the same batch with the bad ids' weights at 0 is what the module must compute
        valid = []
        pos = 0
        lengths = kw["lengths"].tolist()
        for f, key in enumerate(keys):
            n = sum(lengths[f * B:(f + 1) * B])
            valid += [0 <= i < TABLE_OF[key].num_rows for i in ids[pos:pos + n]]
            pos += n
        mask = torch.tensor(valid, dtype=torch.float32)
        w = kw.get("weights")
        clean["weights"] = mask if w is None else w * mask
        clean["values"] = torch.where(mask.bool(), kw["values"], torch.zeros_like(kw["values"]))
        out = emb(KeyedJaggedBatch(**kw))
        want = expected_output(ref, clean, None)
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
        kept = {t.name: (emb.table_weight(t.name).clone(),
                         {s: v.clone() for s, v in emb.table_optimizer_state(t.name).items()}) for t in TABLES}
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(0)))
        touched_kw = dict(kw, values=torch.where(mask.bool(), kw["values"], torch.full_like(kw["values"], -1)))
        assert_untouched_rows_kept(kept, emb, touched_kw)
        outs.append(out.detach())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- cached tables
CACHED = [TableConfig("user", 20, 8, placement="cached", cache_rows=6, cache_store="host", cache_policy="lru",
                      optimizer=OptimizerConfig("adagrad", lr=0.1)),
          TableConfig("item", 7, 4, optimizer=OptimizerConfig("sgd", lr=0.1))]


def _values(emb: TableBatchedEmbedding) -> Dict[str, torch.Tensor]:
    """Every table's weights and optimizer state by value (a cached table's: its backing store)."""
    out = {}
    for t in CACHED:
        out[t.name] = emb.table_weight(t.name).clone()
        for s, v in emb.table_optimizer_state(t.name).items():
            out[f"{t.name}.{s}"] = v.clone()
    return out


cached_bags = st.lists(st.one_of(*[st.integers(0, 19)] * 12, st.sampled_from([-1, 20, 2**62])), max_size=4)


@settings(max_examples=max(10, settings.default.max_examples // 3))
@given(st.lists(st.tuples(st.lists(cached_bags, min_size=1, max_size=3), st.booleans(), st.sampled_from(["lru", "lfu", "lookahead"])),
                min_size=1, max_size=4),
       st.sampled_from(BACKENDS))
@example([([[0, 1, 2, 3], [4, 5, 6, 7]], True, "lru"), ([[8, 9], [0]], False, "lru"), ([[0, 1], [2]], True, "lru")],
         "cpu")
@example([([[0, 1, 2, 3], [4, 5, 6, 7]], False, "lookahead"), ([[8, 9, 25], [0]], True, "lookahead"),
          ([[0, 1], [2]], False, "lookahead")], "reference")
def test_cached_tables_refuse_bad_batches_and_stay_usable(steps, backend):
    """A cached table (6 cache slots over 20 rows): a bad id is named before any row moves, a
    batch with more distinct rows than the cache can hold is a CacheCapacityError naming the
    table; neither changes a table, and the module trains on afterwards."""
    from neo.embedding.cache.index import CacheCapacityError

    policy = steps[0][2]
    tables = [TableConfig(**{**CACHED[0].__dict__, "cache_policy": policy}), CACHED[1]]
    emb = TableBatchedEmbedding(tables, backend=backend, seed=5)
    for user_bags, prefetch, _ in steps:
        B = len(user_bags)
        batch = KeyedJaggedBatch.from_lists({"user": user_bags, "item": [[b % 7] for b in range(B)]})
        ids = [i for bag in user_bags for i in bag]
        before = _values(emb)
        try:
            if prefetch:
                emb.prefetch(batch)
            out = emb(batch)
        except EmbeddingInputError as e:
            assert any(not 0 <= i < 20 for i in ids), f"{backend}: a good batch was refused: {e}"
            assert "feature 'user' (table 'user')" in str(e), str(e)
            event("cached: bad id")
        except CacheCapacityError as e:
            assert all(0 <= i < 20 for i in ids) and len(set(ids)) > 3, f"{backend}: {e}"
            assert "table 'user'" in str(e), str(e)
            event("cached: over capacity")
        else:
            event("cached: trained")
            assert all(0 <= i < 20 for i in ids), f"{backend}: a bad id was accepted: {ids}"
            w = before["user"].double()
            want = torch.stack([sum((w[i] for i in bag), torch.zeros(8, dtype=torch.float64)) for bag in user_bags])
            torch.testing.assert_close(out[:, :8].double(), want, rtol=1e-5, atol=1e-5)
            out.backward(torch.ones_like(out))
            after = _values(emb)
            keep = torch.tensor([r not in set(ids) for r in range(20)])
            assert torch.equal(after["user"][keep], before["user"][keep])
            assert torch.equal(after["user.sum"][keep], before["user.sum"][keep])
            continue
        after = _values(emb)
        for k in before:
            assert torch.equal(before[k], after[k]), f"{backend}: {k} changed after a refused batch"
    good = KeyedJaggedBatch.from_lists({"user": [[0, 1], [2]], "item": [[0], [1]]})
    emb(good).sum().backward()                     # no row left pinned by a refused batch


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 9)), min_size=1, max_size=6))
def test_both_ways_of_finding_each_ids_table_agree(features):
    """``id_limits`` by binary search (the CUDA path) equals repeat_interleave (the CPU path),
    empty features included: (ids of the feature, rows of its table) per feature."""
    from neo.embedding.checks import id_limits

    counts = torch.tensor([c for c, _ in features], dtype=torch.int64)
    rows = torch.tensor([r for _, r in features], dtype=torch.int64)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    n = int(starts[-1])
    expected = torch.cat([torch.full((c,), r, dtype=torch.int64) for c, r in features])
    for search in (False, True):
        assert torch.equal(id_limits(rows, starts, n, search=search), expected), search
