"""The loader's gathers of rows across a window's blocks (jagged and fixed-width columns): Neo's C++
copies against the numpy references, and bad requests refused with the row named."""

import numpy as np
import pytest

from data_pipeline.reader import (fixed_take, fixed_take_reference, jagged_take, jagged_take_reference,
                                  take_from_parts, take_rows)
from data_pipeline.writer import Columns
from neo.cpp import cpu_kernels


def _blocks(rng, n_blocks, dtype):
    out = []
    for _ in range(n_blocks):
        rows = int(rng.integers(1, 60))
        lens = rng.integers(0, 9, rows)
        offs = np.zeros(rows + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        out.append((rng.integers(0, 1 << 30, int(offs[-1])).astype(dtype), offs))
    return out


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jagged_take_equals_the_reference(dtype, seed):
    rng = np.random.default_rng(seed)
    blocks = _blocks(rng, 4, dtype)
    part = rng.integers(0, 4, 500)
    row = np.array([rng.integers(0, len(blocks[p][1]) - 1) for p in part], dtype=np.int64)
    ids, offs = jagged_take(blocks, part, row)
    ref_ids, ref_offs = jagged_take_reference(blocks, part, row)
    assert ids.dtype == dtype and offs.dtype == np.int64
    np.testing.assert_array_equal(offs, ref_offs)
    np.testing.assert_array_equal(ids, ref_ids)
    # row by row, from first principles
    for i, (p, r) in enumerate(zip(part, row)):
        v, o = blocks[p]
        np.testing.assert_array_equal(ids[offs[i]:offs[i + 1]], v[o[r]:o[r + 1]])


def test_jagged_take_reads_read_only_ids_and_handles_empty_rows():
    ids = np.arange(10, dtype=np.int64)
    ids.setflags(write=False)                           # as Arrow's buffers are
    offs = np.array([0, 0, 4, 4, 10], np.int64)
    got, o = jagged_take([(ids, offs)], np.zeros(4, np.int64), np.array([3, 0, 1, 2], np.int64))
    np.testing.assert_array_equal(o, [0, 6, 6, 10, 10])
    np.testing.assert_array_equal(got, [4, 5, 6, 7, 8, 9, 0, 1, 2, 3])
    got, o = jagged_take([(ids, offs)], np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert got.size == 0 and o.tolist() == [0]


def test_jagged_take_refuses_rows_outside_the_blocks():
    ids, offs = np.arange(5, dtype=np.int64), np.array([0, 2, 5], np.int64)
    with pytest.raises(ValueError, match="output row 1 asks for row 2 of block 0"):
        jagged_take([(ids, offs)], np.zeros(2, np.int64), np.array([0, 2], np.int64))
    with pytest.raises(ValueError, match="of block 1"):
        jagged_take([(ids, offs)], np.array([1], np.int64), np.array([0], np.int64))
    with pytest.raises(ValueError, match="offsets outside"):
        jagged_take([(ids, np.array([0, 2, 6], np.int64))], np.zeros(1, np.int64), np.zeros(1, np.int64))
    # offsets that leave the ids in the middle and come back: the row is refused, never copied
    with pytest.raises(ValueError, match=r"row 0 spans ids \[0, 100\) of 5"):
        jagged_take([(ids, np.array([0, 100, 5], np.int64))], np.zeros(1, np.int64), np.zeros(1, np.int64))


def test_take_from_parts_equals_taking_from_the_concatenated_window():
    rng = np.random.default_rng(5)
    parts = []
    for n in (7, 30, 1, 12):
        lens = rng.integers(0, 5, n)
        offs = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        parts.append(Columns(rng.integers(0, 2, n).astype(np.int8), rng.random((n, 3), dtype=np.float32),
                             [rng.integers(0, 100, n), (rng.integers(0, 100, int(offs[-1])), offs),
                              rng.integers(0, 100, (n, 2))]))
    whole = Columns.concat(parts)
    idx = rng.permutation(len(whole))[:35]
    got, want = take_from_parts(parts, idx), take_rows(whole, idx)
    np.testing.assert_array_equal(got.label, want.label)
    np.testing.assert_array_equal(got.dense, want.dense)
    np.testing.assert_array_equal(got.sparse[0], want.sparse[0])
    np.testing.assert_array_equal(got.sparse[2], want.sparse[2])
    for a, b in zip(got.sparse[1], want.sparse[1]):
        np.testing.assert_array_equal(a, b)
    # and take_rows on the window from first principles
    for i, k in enumerate(idx):
        v, o = whole.sparse[1]
        gv, go = got.sparse[1]
        np.testing.assert_array_equal(gv[go[i]:go[i + 1]], v[o[k]:o[k + 1]])
        assert got.label[i] == whole.label[k]


def test_jagged_take_of_other_integer_widths_or_mixed_blocks_is_int64():
    rng = np.random.default_rng(3)
    blocks = _blocks(rng, 2, np.int16) + _blocks(rng, 1, np.int32)
    part = np.array([0, 2, 1, 0], np.int64)
    row = np.zeros(4, np.int64)
    ids, offs = jagged_take(blocks, part, row)
    ref_ids, ref_offs = jagged_take_reference(blocks, part, row)
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(offs, ref_offs)
    np.testing.assert_array_equal(ids, ref_ids.astype(np.int64))


@pytest.mark.parametrize("dtype,shape", [(np.int8, ()), (np.bool_, ()), (np.float32, (13,)), (np.float16, (3,)),
                                         (np.int64, (2,)), (np.int32, (1,)), (np.float64, (2, 3))])
def test_fixed_take_equals_the_reference_and_first_principles(dtype, shape):
    assert cpu_kernels("fixed_take") is not None              # the C++ copy is what is tested here
    rng = np.random.default_rng(len(shape) + np.dtype(dtype).itemsize)
    blocks = [(rng.random((int(n),) + shape) * 100).astype(dtype) for n in rng.integers(1, 70, 5)]
    for b in blocks:
        b.setflags(write=False)                         # as Arrow's buffers are
    part = rng.integers(0, 5, 300)
    row = np.array([rng.integers(0, len(blocks[p])) for p in part], dtype=np.int64)
    got = fixed_take(blocks, part, row)
    assert got.dtype == dtype and got.shape == (300,) + shape
    np.testing.assert_array_equal(got, fixed_take_reference(blocks, part, row))
    for i, (p, r) in enumerate(zip(part, row)):
        np.testing.assert_array_equal(got[i], blocks[p][r])
    assert fixed_take(blocks, np.zeros(0, np.int64), np.zeros(0, np.int64)).shape == (0,) + shape


def test_fixed_take_refuses_rows_outside_the_blocks_and_mixed_blocks_take_the_reference():
    blocks = [np.arange(6, dtype=np.int64).reshape(3, 2), np.arange(4, dtype=np.int64).reshape(2, 2)]
    with pytest.raises(ValueError, match="output row 1 asks for row 2 of block 1"):
        fixed_take(blocks, np.array([0, 1], np.int64), np.array([2, 2], np.int64))
    with pytest.raises(ValueError, match="of block 2"):
        fixed_take(blocks, np.array([2], np.int64), np.array([0], np.int64))
    out = np.zeros((1, 2), np.int64)
    with pytest.raises(ValueError, match="differs from out"):
        cpu_kernels("fixed_take").fixed_take([blocks[0].astype(np.int32)], np.zeros(1, np.int64),
                                             np.zeros(1, np.int64), out)
    # blocks of two dtypes (row groups written by two writers): numpy's promotion, as the reference
    mixed = [blocks[0], blocks[1].astype(np.int32)]
    got = fixed_take(mixed, np.array([1, 0], np.int64), np.array([1, 2], np.int64))
    assert got.dtype == np.int64 and got.tolist() == [[2, 3], [4, 5]]
