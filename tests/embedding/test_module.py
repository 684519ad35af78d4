"""TableBatchedEmbedding behaviour: groups, output order, errors naming feature and table, state access."""

import pytest
import torch

from neo.config.embedding import ConfigError, OptimizerConfig, TableConfig
from neo.embedding import EmbeddingInputError, TableBatchedEmbedding
from neo.sparse import KeyedJaggedBatch


def mixed_tables():
    return [
        TableConfig("a", 6, 4, optimizer=OptimizerConfig("adagrad", lr=0.1)),
        TableConfig("b", 5, 8, feature_names=("b1", "b2"), dtype="fp16", pooling="mean"),
        TableConfig("c", 4, 12, optimizer=OptimizerConfig("adagrad", lr=0.1)),
    ]


def test_groups_and_table_order():
    emb = TableBatchedEmbedding(mixed_tables(), backend="reference")
    assert len(emb.groups) == 2                       # (fp32, adagrad) and (fp16, sgd)
    assert emb.feature_names == ["a", "b1", "b2", "c"]
    batch = KeyedJaggedBatch.from_lists({"c": [[1], [2]], "b2": [[0], []], "a": [[5], [1, 1]], "b1": [[4, 3], [0]]})
    out = emb(batch)
    assert out.shape == (2, 4 + 8 + 8 + 12)
    wa, wb, wc = (emb.table_weight(n).float() for n in "abc")
    torch.testing.assert_close(out[1, 0:4], 2 * wa[1])
    torch.testing.assert_close(out[0, 4:12], (wb[4] + wb[3]) / 2)
    torch.testing.assert_close(out[1, 12:20], torch.zeros(8))
    torch.testing.assert_close(out[0, 20:32], wc[1])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_forward_without_grad_pools_as_the_training_forward(backend):
    """Under no_grad the groups are pooled without an autograd node; the second group's ids
    start past the first's (its offsets are shifted to 0): the same output as the training path."""
    emb = TableBatchedEmbedding(mixed_tables(), backend=backend)
    batch = KeyedJaggedBatch.from_lists({"c": [[1], [2, 3]], "b2": [[0], []], "a": [[5], [1, 1]],
                                         "b1": [[4, 3], [0]]})
    trained = emb(batch)                      # grad enabled, training mode: through autograd
    assert trained.requires_grad
    with torch.no_grad():
        pooled = emb(batch)
    assert not pooled.requires_grad
    assert torch.equal(pooled, trained.detach())
    wb = emb.table_weight("b").float()        # b (fp16) is the second group: its ids follow a's and c's
    torch.testing.assert_close(pooled[0, 4:12], (wb[4] + wb[3]) / 2)


def test_errors_name_feature_and_table():
    emb = TableBatchedEmbedding(mixed_tables(), backend="reference")
    good = {"a": [[1]], "b1": [[1]], "b2": [[1]], "c": [[1]]}
    with pytest.raises(EmbeddingInputError, match=r"feature 'b2' \(table 'b'\): id 5 at sample 1 is out of range \[0, 5\)"):
        emb(KeyedJaggedBatch.from_lists({**{k: v * 2 for k, v in good.items()}, "b2": [[1], [0, 5]]}))
    with pytest.raises(EmbeddingInputError, match=r"feature 'a' \(table 'a'\): id -1"):
        emb(KeyedJaggedBatch.from_lists({**good, "a": [[-1]]}))
    with pytest.raises(EmbeddingInputError, match=r"\['zzz'\] are read by no table"):
        emb(KeyedJaggedBatch.from_lists({**good, "zzz": [[0]]}))
    with pytest.raises(EmbeddingInputError, match=r"lacks feature\(s\) \['c'\], read by table\(s\) \['c'\]"):
        emb(KeyedJaggedBatch.from_lists({k: v for k, v in good.items() if k != "c"}))


def test_unchecked_mode_ignores_bad_ids_without_crashing():
    tables = [TableConfig("a", 4, 4)]
    emb = TableBatchedEmbedding(tables, backend="reference", validate=False)
    before = emb.table_weight("a").clone()
    out = emb(KeyedJaggedBatch.from_lists({"a": [[1, 99, -3]]}))
    torch.testing.assert_close(out[0], before[1])
    out.sum().backward()
    assert torch.equal(emb.table_weight("a")[[0, 2, 3]], before[[0, 2, 3]])


def test_no_update_without_grad_or_in_eval():
    emb = TableBatchedEmbedding([TableConfig("a", 4, 4)], backend="reference")
    batch = KeyedJaggedBatch.from_lists({"a": [[1]]})
    before = emb.table_weight("a").clone()
    with torch.no_grad():
        assert not emb(batch).requires_grad
    emb.eval()
    assert not emb(batch).requires_grad
    emb.train()
    emb(batch).sum().backward()
    assert not torch.equal(emb.table_weight("a"), before)


def test_state_is_readable_writable_and_checkpointable():
    tables = [TableConfig("a", 4, 4, optimizer=OptimizerConfig("rowwise_adagrad", lr=0.5)),
              TableConfig("b", 3, 8, optimizer=OptimizerConfig("adam", lr=0.5))]
    emb = TableBatchedEmbedding(tables, backend="reference", seed=1)
    batch = KeyedJaggedBatch.from_lists({"a": [[1, 2]], "b": [[0]]})
    emb(batch).sum().backward()
    assert emb.table_optimizer_state("a")["sum"].shape == (4,)
    assert set(emb.table_optimizer_state("b")) == {"exp_avg", "exp_avg_sq"}
    saved = {k: v.clone() for k, v in emb.state_dict().items()}
    twin = TableBatchedEmbedding(tables, backend="reference", seed=99)
    twin.load_state_dict(saved)
    assert twin.optimizer_steps() == emb.optimizer_steps()
    emb(batch).sum().backward()
    twin(batch).sum().backward()
    for t in "ab":
        assert torch.equal(twin.table_weight(t), emb.table_weight(t))
    emb.set_optimizer_steps(5, table="b")
    assert emb.optimizer_steps() == {"a": 2, "b": 5}
    emb.table_optimizer_state("a")["sum"].fill_(7.0)       # views write through
    assert float(emb.state_dict()["a.sum"][0]) == 7.0


def test_state_dict_names_the_tables():
    """Keys and shapes per table (as TorchRec's ``embedding_bags.TABLE.weight``): a state dict
    loads only into the same tables, and every mismatch names the table."""
    opt = OptimizerConfig("rowwise_adagrad", lr=0.1)
    tables = [TableConfig("a", 10, 4, optimizer=opt), TableConfig("b", 7, 8, feature_names=("b1", "b2"), optimizer=opt)]
    emb = TableBatchedEmbedding(tables, backend="reference", seed=1)
    sd = emb.state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == {"a.weight": (10, 4), "a.sum": (10,), "a.step": (),
                                                          "b.weight": (7, 8), "b.sum": (7,), "b.step": ()}
    assert torch.equal(sd["b.weight"], emb.table_weight("b"))
    # the same tables listed in another order: each table gets its own weights back
    swapped = TableBatchedEmbedding(tables[::-1], backend="reference", seed=2)
    swapped.load_state_dict(sd)
    for t in "ab":
        assert torch.equal(swapped.table_weight(t), emb.table_weight(t))
    # the same total size in other shapes, or another name: refused, naming the table
    reshaped = TableBatchedEmbedding([TableConfig("a", 5, 8, optimizer=opt),
                                      TableConfig("b", 14, 4, feature_names=("b1", "b2"), optimizer=opt)],
                                     backend="reference")
    with pytest.raises(RuntimeError, match=r"table 'a': a\.weight is \(10, 4\) torch\.float32 in the state dict, "
                                           r"\(5, 8\) torch\.float32 here"):
        reshaped.load_state_dict(sd)
    renamed = TableBatchedEmbedding([TableConfig("c", 10, 4, optimizer=opt), tables[1]], backend="reference")
    with pytest.raises(RuntimeError, match=r"(?s)Missing key\(s\) in state_dict: \"c\.weight\".*"
                                           r"Unexpected key\(s\) in state_dict: \"a\.weight\""):
        renamed.load_state_dict(sd)
    fp16 = TableBatchedEmbedding([TableConfig("a", 10, 4, dtype="fp16", optimizer=opt), tables[1]], backend="reference")
    with pytest.raises(RuntimeError, match=r"table 'a': a\.weight is \(10, 4\) torch\.float32 .* torch\.float16"):
        fp16.load_state_dict(sd)
    # tables of one group share its step counter: where it counts (Adam, LAMB), saved steps that
    # disagree are named, not merged (the last one loaded won)
    adam = [TableConfig(t.name, t.num_rows, t.dim, feature_names=t.feature_names,
                        optimizer=OptimizerConfig("adam", lr=0.1)) for t in tables]
    a2 = TableBatchedEmbedding(adam[::-1], backend="reference", seed=2)
    split = dict(TableBatchedEmbedding(adam, backend="reference", seed=1).state_dict(),
                 **{"a.step": torch.tensor(10), "b.step": torch.tensor(3)})
    with pytest.raises(RuntimeError, match=r"tables \['a', 'b'\] share one optimizer step counter here .*"
                                           r"\{'a': 10, 'b': 3\}; load the state dict without its '\.step' entries"):
        a2.load_state_dict(split)
    result = a2.load_state_dict({k: v for k, v in split.items() if not k.endswith(".step")}, strict=False)
    assert sorted(result.missing_keys) == ["a.step", "b.step"]
    a2.set_optimizer_steps(10)
    assert a2.optimizer_steps() == {"a": 10, "b": 10}
    swapped.load_state_dict(dict(sd, **{"a.step": torch.tensor(10), "b.step": torch.tensor(3)}))   # rowwise
    # Adagrad never reads the step: no refusal there


def test_state_dict_of_cached_tables_holds_every_row():
    """A cached table's entries are its whole backing store (the cache flushed into it), and
    loading writes the store and empties the cache, so the next lookups read the loaded rows."""
    cached = dict(placement="cached", cache_rows=4, cache_store="host", optimizer=OptimizerConfig("adagrad", lr=0.5))
    tables = [TableConfig("c", 20, 4, **cached), TableConfig("d", 6, 4)]
    emb = TableBatchedEmbedding(tables, backend="reference", seed=1)
    batch = KeyedJaggedBatch.from_lists({"c": [[1, 2], [3, 19]], "d": [[0], [5]]})
    emb(batch).sum().backward()
    sd = {k: v.clone() for k, v in emb.state_dict().items()}
    assert sd["c.weight"].shape == (20, 4) and sd["c.sum"].shape == (20, 4)
    twin = TableBatchedEmbedding(tables, backend="reference", seed=7)
    twin(batch).sum().backward()                           # its cache now holds other values of rows 1, 2, 3, 19
    twin.load_state_dict(sd)
    assert torch.equal(twin(batch), emb(batch))
    for t in "cd":
        assert torch.equal(twin.table_weight(t), emb.table_weight(t))


def test_learning_rate_can_change():
    tables = [TableConfig("a", 4, 4, optimizer=OptimizerConfig("sgd", lr=1.0))]
    emb = TableBatchedEmbedding(tables, backend="reference")
    batch = KeyedJaggedBatch.from_lists({"a": [[1]]})
    w0 = emb.table_weight("a")[1].clone()
    emb.set_learning_rate(0.25)
    emb(batch).sum().backward()
    torch.testing.assert_close(emb.table_weight("a")[1], w0 - 0.25)


def test_config_validation_names_fields():
    with pytest.raises(ConfigError, match=r"table 't': dim must be a positive multiple of 4, got 6"):
        TableConfig("t", 10, 6)
    with pytest.raises(ConfigError, match=r"table 't': pooling: 'max' is not one of \['sum', 'mean'\]"):
        TableConfig("t", 10, 8, pooling="max")
    with pytest.raises(ConfigError, match=r"optimizer.type: 'rmsprop' is not one of"):
        OptimizerConfig("rmsprop")
    with pytest.raises(ConfigError, match=r"num_rows must be a positive integer"):
        TableConfig("t", 0, 8)
    with pytest.raises(ValueError, match=r"feature 'x' is read by tables 'a' and 'b'"):
        TableBatchedEmbedding([TableConfig("a", 2, 4, feature_names=("x",)), TableConfig("b", 2, 4, feature_names=("x",))])


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_rows=True), r"num_rows must be a positive integer, got True"),
    (dict(feature_names="item"), r"feature_names must be a sequence of names, got the string 'item'"),
    (dict(feature_names=("a", "")), r"feature_names must be non-empty strings"),
    (dict(stochastic_rounding="no"), r"stochastic_rounding must be true or false, got 'no'"),
    (dict(init_scale=float("inf")), r"init_scale must be null or a number in \(0, 3\.40282e\+38\]"),
    (dict(init_scale=float("nan")), r"init_scale must be null"),
    (dict(init_scale=-1.0), r"init_scale must be null"),
    (dict(init_scale=1e5, dtype="fp16"), r"init_scale must be null or a number in \(0, 65504\] .* in fp16"),
    (dict(init_scale=3.4e38, dtype="bf16"), r"init_scale must be null or a number in \(0, 3\.38953e\+38\] .* in bf16"),
])
def test_table_config_refuses_what_would_fail_later(kwargs, match):
    """Values that used to pass and then fail inside the module (a uniform_ bound out of range)
    or mean something else (a string's letters as feature names, any non-empty string as true)."""
    kw = dict(num_rows=10, dim=4) | kwargs
    with pytest.raises(ConfigError, match=rf"table 't': {match}"):
        TableConfig("t", **kw)


@pytest.mark.parametrize("name", ["lr", "eps", "weight_decay", "initial_accumulator_value"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_optimizer_config_refuses_values_that_are_not_finite(name, value):
    with pytest.raises(ConfigError, match=rf"optimizer\.{name} must be a finite number >= 0"):
        OptimizerConfig("adagrad", **{name: value})


def test_set_learning_rate_checks_its_table_and_value():
    emb = TableBatchedEmbedding(mixed_tables(), backend="reference")
    with pytest.raises(ValueError, match=r"no table 'nope' here; tables: \['a', 'c', 'b'\]|no table 'nope' here"):
        emb.set_learning_rate(0.1, table="nope")
    for bad in (float("nan"), float("inf"), -0.5):
        with pytest.raises(ValueError, match="learning rate of table 'a' must be a finite number >= 0"):
            emb.set_learning_rate(bad)
    emb.set_learning_rate(0.25, table="b")                    # alone in its group (fp16, sgd)
    lr_of = lambda name: next(lr for g, lr in zip(emb.groups, emb.learning_rates)  # noqa: E731
                              if any(t.name == name for t in g.layout.tables))
    assert (lr_of("a"), lr_of("b"), lr_of("c")) == (0.1, 0.25, 0.1)


def test_tables_that_share_a_fused_update_set_their_learning_rate_together():
    """a and c (fp32 adagrad, lr 0.1) are one group: one fused update, one learning rate. Setting
    a alone (say to freeze it) would change c too (found by a TorchRec-user walkthrough of
    2026-11-29): it is refused, naming the group, and nothing changes; both together, to one
    value, is taken."""
    emb = TableBatchedEmbedding(mixed_tables(), backend="reference")
    for asked in ({"a": 0.0}, {"a": 0.0, "c": 0.5}, {"a": 0.0, "b": 0.3}):
        with pytest.raises(ValueError, match=r"tables \['a', 'c'\] share one fused update and learning rate"):
            emb.set_learning_rates(asked)
        assert sorted(emb.learning_rates) == [0.01, 0.1]      # nothing set (b's sgd default is 0.01)
    with pytest.raises(ValueError, match="share one fused update"):
        emb.set_learning_rate(0.0, table="a")
    emb.set_learning_rates({"a": 0.0, "c": 0.0})
    emb.set_learning_rate(0.5)                                # every table
    assert emb.learning_rates == [0.5, 0.5]


@pytest.mark.parametrize("b_optimizer", ["adagrad", "sgd"])
def test_pooling_a_subset_of_bags_keeps_the_full_update(b_optimizer):
    """``pooled_bags``: unpooled bags come out as zeros; the fused update still covers every bag
    (what a data-parallel replica does with the other ranks' samples). With ``b`` on another
    optimizer the kernels' groups reorder the features (a1, a2, c | b): the flags follow their bags."""
    from neo.config.embedding import OptimizerConfig

    opt = OptimizerConfig("adagrad", lr=0.1)
    tables = [TableConfig("a", 30, 8, optimizer=opt, feature_names=("a1", "a2")),
              TableConfig("b", 20, 4, optimizer=OptimizerConfig(b_optimizer, lr=0.1), pooling="mean"),
              TableConfig("c", 10, 4, optimizer=opt)]
    full = TableBatchedEmbedding(tables, backend="cpu", seed=2)
    part = TableBatchedEmbedding(tables, backend="cpu", seed=2)
    batch = KeyedJaggedBatch.from_lists({"a1": [[1, 2], [3], [], [4, 4]], "a2": [[5], [6, 7], [8], [9]],
                                         "b": [[1], [2, 3], [4], []], "c": [[0, 1], [2], [3], [9]]},
                                        weights=None)
    mask = torch.tensor([1, 0, 1, 0] + [0, 0, 1, 1] + [1, 1, 0, 1] + [0, 1, 1, 0], dtype=torch.bool)   # (F * B,)
    grad = torch.randn(4, 24, generator=torch.Generator().manual_seed(0))
    out_full, out_part = full(batch), part(batch, pooled_bags=mask)
    cols = {"a1": slice(0, 8), "a2": slice(8, 16), "b": slice(16, 20), "c": slice(20, 24)}
    for f, key in enumerate(("a1", "a2", "b", "c")):
        for b in range(4):
            want = out_full[b, cols[key]] if mask[f * 4 + b] else torch.zeros_like(out_full[b, cols[key]])
            assert torch.equal(out_part[b, cols[key]], want), (key, b)
    (out_full * grad).sum().backward()
    (out_part * 0 + out_part).backward(grad)                                       # the same gradient rows
    for t in tables:
        assert torch.equal(full.table_weight(t.name), part.table_weight(t.name)), t.name
        for name, v in full.table_optimizer_state(t.name).items():
            assert torch.equal(v, part.table_optimizer_state(t.name)[name]), (t.name, name)


def test_dtype_conversions_are_refused():
    """``model.half()`` would turn the optimizer state to fp16 too, and the fused update fails
    later with a low-level error; ``.to(device)`` and a conversion that changes nothing pass."""
    emb = TableBatchedEmbedding([TableConfig("a", 10, 4), TableConfig("h", 6, 4, dtype="fp16")], backend="cpu")
    emb.to("cpu")
    for convert in (lambda: emb.half(), lambda: emb.to(torch.bfloat16), lambda: emb.float(),
                    lambda: torch.nn.Sequential(emb).double()):
        with pytest.raises(TypeError, match=r"would change dtype: .* set TableConfig\.dtype"):
            convert()
    assert emb.table_weight("a").dtype == torch.float32 and emb.table_weight("h").dtype == torch.float16


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_validate_off_counts_the_ids_it_skips_per_table(backend):
    """validate=False: out-of-range ids contribute nothing and are counted per table (over every
    lookup), like a skip policy's report; the output is the lookup of the batch without them."""
    gen = torch.Generator().manual_seed(3)
    tables = [TableConfig("a", 10, 4), TableConfig("b", 7, 8, feature_names=("b1", "b2"))]
    emb = TableBatchedEmbedding(tables, backend=backend, validate=False, seed=1)
    rows = {"a": 10, "b1": 7, "b2": 7}
    table_of = {"a": "a", "b1": "b", "b2": "b"}
    want = {"a": 0, "b": 0}
    for _ in range(3):
        lists = {f: [torch.randint(-3, n + 3, (int(k),), generator=gen).tolist()
                     for k in torch.randint(0, 5, (6,), generator=gen)] for f, n in rows.items()}
        for f, bags in lists.items():
            want[table_of[f]] += sum(1 for bag in bags for i in bag if not 0 <= i < rows[f])
        got = emb(KeyedJaggedBatch.from_lists(lists))
        clean = {f: [[i for i in bag if 0 <= i < rows[f]] for bag in bags] for f, bags in lists.items()}
        assert torch.equal(got, emb(KeyedJaggedBatch.from_lists(clean)))
        assert emb.skipped_ids == want
    assert sum(want.values()) > 0


def test_a_failed_update_is_not_counted_as_a_step(monkeypatch):
    """Adam's and LAMB's bias correction use the update count: an update that raised must not
    advance it, or a retried step would be corrected as the step after."""
    emb = TableBatchedEmbedding([TableConfig("a", 10, 4, optimizer=OptimizerConfig("adam", lr=0.1))],
                                backend="reference")
    batch = KeyedJaggedBatch.from_lists({"a": [[1, 2], [3]]})
    emb(batch).sum().backward()
    assert emb.optimizer_steps() == {"a": 1}

    def failing(*args, **kwargs):
        raise RuntimeError("update failed")

    monkeypatch.setattr(emb.backend, "backward_update", failing)
    with pytest.raises(RuntimeError, match="update failed"):
        emb(batch).sum().backward()
    assert emb.optimizer_steps() == {"a": 1}
    monkeypatch.undo()
    emb(batch).sum().backward()
    assert emb.optimizer_steps() == {"a": 2}


def test_count_skipped_off_counts_nothing_and_says_so():
    """count_skipped=False (ids checked upstream): the lookup skips invalid ids as with counting on,
    but skipped_ids raises instead of reporting a count it never made."""
    tables = [TableConfig("a", 10, 4)]
    counting = TableBatchedEmbedding(tables, backend="reference", validate=False, seed=1)
    silent = TableBatchedEmbedding(tables, backend="reference", validate=False, seed=1, count_skipped=False)
    batch = KeyedJaggedBatch.from_lists({"a": [[1, 12], [-1, 3]]})
    assert torch.equal(counting(batch), silent(batch))
    assert counting.skipped_ids == {"a": 2}
    with pytest.raises(RuntimeError, match="count_skipped=False"):
        silent.skipped_ids


def test_ids_of_bags_equals_repeat_interleave():
    """The id mask of the flagged bags (pooled_bags' compaction) against repeat_interleave, with
    empty bags (flagged or not) before, between and after runs."""
    from neo.embedding.group_runner import ids_of_bags

    gen = torch.Generator().manual_seed(5)
    for nb in (1, 2, 7, 300):
        for _ in range(20):
            lengths = torch.randint(0, 4, (nb,), generator=gen) * torch.randint(0, 2, (nb,), generator=gen)
            bags = torch.randint(0, 2, (nb,), generator=gen).bool()
            offsets = torch.zeros(nb + 1, dtype=torch.int64)
            torch.cumsum(lengths, 0, out=offsets[1:])
            want = torch.repeat_interleave(bags, lengths)
            assert torch.equal(ids_of_bags(bags, offsets, int(lengths.sum())), want), (lengths, bags)


def test_skipped_counts_move_with_the_module():
    """The skipped-id counts live on the tables' device and follow .to(); converting the module's
    dtype is refused before anything moves."""
    emb = TableBatchedEmbedding([TableConfig("a", 10, 4)], backend="reference", validate=False)
    emb(KeyedJaggedBatch.from_lists({"a": [[11], [2]]}))
    emb = emb.to("cpu")
    assert emb._invalid.counts.device.type == "cpu" and emb._invalid.counts.dtype == torch.int64
    assert emb.skipped_ids == {"a": 1}
    with pytest.raises(TypeError):
        emb.half()
    assert emb.skipped_ids == {"a": 1}


def test_torchrec_inputs_are_taken_and_other_types_named():
    """What a TorchRec user passes: a KeyedJaggedTensor is looked up as the same KeyedJaggedBatch
    (pooled and unpooled); a list, or a variable-batch KJT without inverse indices, is a named error, not an attribute
    error from inside; device='meta' says what to do instead."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    emb = TableBatchedEmbedding(mixed_tables(), backend="reference")
    batch = KeyedJaggedBatch.from_lists({"a": [[1], [2, 3]], "b1": [[0], []], "b2": [[4], [1]], "c": [[], [3]]})
    kjt = batch.to_torchrec()
    assert isinstance(kjt, KeyedJaggedTensor)
    with torch.no_grad():
        assert torch.equal(emb(kjt), emb(batch))
        assert all(torch.equal(emb.sequence(kjt)[f].values, s.values) for f, s in emb.sequence(batch).items())
    with pytest.raises(TypeError, match=r"expected a neo\.sparse\.KeyedJaggedBatch .*got builtins\.list"):
        emb([[1], [2]])
    vbe = KeyedJaggedTensor(keys=["a", "b1"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1]),
                            stride_per_key_per_rank=[[2], [1]])
    with pytest.raises(ValueError, match="variable-batch KeyedJaggedTensor .* needs its inverse_indices"):
        emb(vbe)                               # taken with its inverse indices: tests/embedding/test_variable_batch.py
    meta = TableBatchedEmbedding(mixed_tables(), device="meta")       # a placeholder: its use says what to do
    with pytest.raises(RuntimeError, match="device='meta'.*parallelize.*ShardedEmbeddingCollection"):
        meta(kjt)
