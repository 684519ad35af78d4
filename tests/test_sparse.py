"""KeyedJaggedBatch: layout, validation messages, conversions."""

import pytest
import torch

from neo.sparse import JaggedValidationError, KeyedJaggedBatch, concat_features


def example() -> KeyedJaggedBatch:
    return KeyedJaggedBatch.from_lists({"user": [[10, 11], [], [12]], "item": [[7], [8, 9], []]})


def test_worked_example_layout():
    b = example()
    assert b.keys == ("user", "item")
    assert b.values.tolist() == [10, 11, 12, 7, 8, 9]
    assert b.lengths.tolist() == [2, 0, 1, 1, 2, 0]
    assert b.offsets.tolist() == [0, 2, 2, 3, 4, 6, 6]
    assert b.batch_size == 3
    assert b.length_per_key() == [3, 3]
    assert b.offset_per_key() == [0, 3, 6]
    assert b.to_dict() == {"user": [[10, 11], [], [12]], "item": [[7], [8, 9], []]}


def test_permute_and_concat():
    b = example()
    p = b.permute(["item", "user"])
    assert p.to_dict() == {"item": [[7], [8, 9], []], "user": [[10, 11], [], [12]]}
    assert p.offsets.tolist() == [0, 1, 3, 3, 5, 5, 6]
    c = concat_features([b.permute(["user"]), b.permute(["item"])])
    assert c.to_dict() == b.to_dict()
    with pytest.raises(KeyError, match="nope"):
        b.permute(["nope"])
    with pytest.raises(ValueError, match=r"permute: features \['user'\] are given more than once"):
        b.permute(["user", "user"])
    with pytest.raises(JaggedValidationError, match="concat_features needs at least one batch"):
        concat_features([])


def test_weights_follow_permutation():
    b = KeyedJaggedBatch.from_lists({"a": [[1], [2, 3]], "b": [[4], []]}, weights={"a": [[0.5], [1.5, 2.5]], "b": [[3.5], []]})
    p = b.permute(["b", "a"])
    assert p.weights.tolist() == [3.5, 0.5, 1.5, 2.5]
    assert p.values.tolist() == [4, 1, 2, 3]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 2]), batch_size=2), "offsets end at 3 but there are 2 ids"),
        (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([2, -0, 0]), batch_size=2), "lengths has 3 entries, expected F \\* B = 1 \\* 2 = 2"),
        (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([3, -1]), batch_size=2), "feature 'f': negative length -1 at sample 1"),
        (dict(values=torch.tensor([1.0, 2.0]), lengths=torch.tensor([1, 1]), batch_size=2), "values \\(ids\\) must be an int32 or int64"),
        (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([1.0, 1.0]), batch_size=2), "lengths must be an int32 or int64"),
        (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]), batch_size=2, weights=torch.tensor([1.0])), "one weight per id"),
        (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]), batch_size=2, offsets=torch.tensor([0, 2, 1])), "feature 'f': offsets decrease at sample 1"),
        (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]), batch_size=2, offsets=torch.tensor([0, 2, 2])), "lengths\\[0\\] = 1 does not match offsets \\(2 ids\\) at sample 0"),
    ],
)
def test_validation_names_the_problem(kwargs, message):
    with pytest.raises(JaggedValidationError, match=message):
        KeyedJaggedBatch(keys=("f",), **kwargs)


def test_validation_names_second_feature():
    with pytest.raises(JaggedValidationError, match="feature 'b'"):
        KeyedJaggedBatch(("a", "b"), torch.tensor([1, 2, 3]), torch.tensor([1, 1, 2, 1]), 2, offsets=torch.tensor([0, 1, 2, 1, 3]))


def test_validate_false_skips_checks():
    b = KeyedJaggedBatch(("f",), torch.tensor([1, 2]), torch.tensor([5, 5]), 2, validate=False)
    with pytest.raises(JaggedValidationError):
        b.check()


def test_torchrec_round_trip():
    import torchrec  # an optional peer of Neo, always installed by the test setup (tools/setup.sh --dev)

    b = KeyedJaggedBatch.from_lists({"a": [[1], [2, 3]], "b": [[4], []]}, weights={"a": [[0.5], [1.5, 2.5]], "b": [[3.5], []]})
    kjt = b.to_torchrec()
    assert isinstance(kjt, torchrec.KeyedJaggedTensor)
    assert kjt.keys() == ["a", "b"]
    assert kjt["a"].values().tolist() == [1, 2, 3]
    assert kjt["b"].lengths().tolist() == [1, 0]
    back = KeyedJaggedBatch.from_torchrec(kjt)
    assert back.to_dict() == b.to_dict()
    assert torch.equal(back.weights, b.weights)
    assert back.batch_size == 2
    empty = KeyedJaggedBatch((), torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 5)
    assert empty.to_torchrec().stride() == 5 and KeyedJaggedBatch.from_torchrec(empty.to_torchrec()).batch_size == 5
