"""The shared-memory exchange (neo.distributed.shm) against gloo's own collectives as the oracle."""

from __future__ import annotations

import glob
import os
import time
import warnings

import pytest
import torch
import torch.distributed as dist

from neo.distributed import ProcessGroups
from neo.distributed.comms import _in_place_output, _launch_a2a, all_to_all
from neo.distributed.process_groups import CommGroup
from neo.distributed.shm import SLOTS, ShmError, ShmExchange, _Segment
from tests.multiprocess import MultiProcessError, run_multiprocess


def _splits(gen: torch.Generator, W: int, n_max: int):
    """(W, W) rows sent from rank s to rank r, identical on every rank (shared seed), zeros included."""
    m = torch.randint(0, n_max + 1, (W, W), generator=gen)
    m[torch.rand(W, W, generator=gen) < 0.2] = 0
    return m


def _a2a_both(ex: ShmExchange, m: torch.Tensor, dtype: torch.dtype, cols: int, seed: int):
    """One AlltoAll through the exchange (launched, not waited) and its gloo oracle."""
    rank, W = dist.get_rank(), dist.get_world_size()
    in_splits, out_splits = m[rank].tolist(), m[:, rank].tolist()
    g = torch.Generator().manual_seed(seed + rank)
    shape = (sum(in_splits), cols) if cols else (sum(in_splits),)
    send = (torch.randn(shape, generator=g) * 1000).to(dtype)
    out_shape = (sum(out_splits),) + shape[1:]
    got, ref = torch.full(out_shape, -1).to(dtype), torch.empty(out_shape, dtype=dtype)
    work = ex.all_to_all_single(got, send, out_splits, in_splits)
    dist.all_to_all_single(ref, send, out_splits, in_splits)
    return work, got, ref


def _exchange_body(rank: int, W: int):
    ex = ShmExchange.create(dist.group.WORLD, segment_bytes=1 << 20)     # small: messages below grow it
    assert ex is not None
    splits = [1] * W
    for out, send in [(torch.empty(W), torch.empty(W + 1)), (torch.empty(W, dtype=torch.int64), torch.empty(W)),
                      (torch.empty(2 * W)[::2], torch.empty(W))]:           # an output with gaps
        try:                          # rejected before any message is numbered: the group stays usable
            ex.all_to_all_single(out, send, splits, splits)
            raise AssertionError("inconsistent AlltoAll arguments were accepted")
        except ShmError as e:
            assert "splits each summing" in str(e)
    for out, send in [(torch.empty(W + 1), torch.empty(1)), (torch.empty(2 * W)[::2], torch.empty(1))]:
        try:
            ex.all_gather_single(out, send)
            raise AssertionError("an AllGather output of the wrong size or with gaps was accepted")
        except ShmError as e:
            assert "all_gather: the output holds" in str(e)
    gen = torch.Generator().manual_seed(0)
    # uneven splits and zero-sized chunks, several dtypes and row shapes, waited one by one
    for i, (dtype, cols) in enumerate([(torch.int64, 0), (torch.float32, 3), (torch.bfloat16, 5), (torch.int32, 0),
                                       (torch.float16, 64)]):
        work, got, ref = _a2a_both(ex, _splits(gen, W, 50), dtype, cols, seed=10 * i)
        work.wait()
        assert torch.equal(got, ref), (dtype, cols)
    # more collectives in flight than slots, waited in reverse order: receives progress at every launch
    pending = [_a2a_both(ex, _splits(gen, W, 40), torch.float32, 7, seed=100 + i) for i in range(2 * SLOTS + 1)]
    for work, got, ref in reversed(pending):
        work.wait()
        assert torch.equal(got, ref)
    # messages past the 1 MiB segment (growth into a new generation), then small ones again
    for i, n in enumerate([300_000, 20, 700_000, 5]):
        work, got, ref = _a2a_both(ex, torch.full((W, W), n), torch.float32, 2, seed=200 + i)
        work.wait()
        assert torch.equal(got, ref), n
    # in place (comms._launch_a2a with in_place=True): equal splits (the output is the sent
    # tensor's memory) and uneven ones, where the output fits inside the sent rows on some ranks
    group = CommGroup(dist.group.WORLD, ex)
    for i, m in enumerate([torch.full((W, W), 37), _splits(gen, W, 60), _splits(gen, W, 60)]):
        in_splits, out_splits = m[rank].tolist(), m[:, rank].tolist()
        send = torch.randn(sum(in_splits), 3, generator=torch.Generator().manual_seed(300 + 10 * i + rank))
        ref = torch.empty(sum(out_splits), 3)
        dist.all_to_all_single(ref, send.clone(), out_splits, in_splits)
        launched = _launch_a2a(send, out_splits, in_splits, group, None, in_place=True)
        got = launched.wait()
        assert torch.equal(got, ref), (i, m.tolist())
        aliased = _in_place_output(send, out_splits, in_splits, rank) is not None
        if got.numel():   # an empty output (a rank that receives nothing) has no memory to share: data_ptr() 0
            assert (got.data_ptr() >= send.data_ptr() and got.data_ptr() < send.data_ptr() + send.nbytes) == aliased
        if i == 0:
            assert got.data_ptr() == send.data_ptr()          # equal splits: always in place
    # AllGather: each rank's block written once, read by all (small blocks by memmove, large by torch)
    for n in (1000, 400_000):
        send = torch.arange(n, dtype=torch.float32) + n * rank
        got, ref = torch.empty(W * n), torch.empty(W * n)
        ex.all_gather_single(got, send).wait()
        dist.all_gather_into_tensor(ref, send)
        assert torch.equal(got, ref), n
    # AllGather read in place (all_gather_apply): every peer's block, in rank order, valid in the
    # call; the sent tensor overwritten in the call (it was copied at the launch); a block large
    # enough to grow the segment; an empty one
    for n in (1000, 400_000, 0):
        send = (torch.arange(n, dtype=torch.float32) + n * rank).view(-1, 1)
        seen = []

        def apply(peer, block, send=send, seen=seen):
            seen.append((peer, block.clone()))
            send.add_(block)
        ex.all_gather_apply(send, apply).wait()
        assert [p for p, _ in seen] == [r for r in range(W) if r != rank], n
        for peer, block in seen:
            assert block.shape == (n, 1) and block.dtype == torch.float32
            assert torch.equal(block, (torch.arange(n, dtype=torch.float32) + n * peer).view(-1, 1)), (n, peer)
        base = torch.arange(n, dtype=torch.float32).view(-1, 1)
        expected = base + n * rank
        for peer, _ in seen:
            expected = expected + (base + n * peer)
        assert torch.equal(send, expected), n
    # no segment file outlives the wait() of the message that needed it
    dist.barrier()
    left = glob.glob(f"/dev/shm/{ex._base}-*")
    ex.close()
    return left


@pytest.mark.parametrize("W", [2, 3])
def test_exchange_matches_gloo(W):
    for left in run_multiprocess(_exchange_body, W, timeout_s=120):
        assert left == [], left


def test_full_dev_shm_is_a_clear_error(monkeypatch, tmp_path):
    def no_space(fd, offset, length):
        raise OSError(28, "No space left on device")

    seg = _Segment.open(str(tmp_path / "seg"), 1, 8 << 20)
    seg.reserve(1 << 20)
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    seg.reserve(1 << 20)                               # already reserved: no call
    with pytest.raises(ShmError, match=r"cannot hold 4.0 MiB more .* enlarge it .*shm=False"):
        seg.reserve(4 << 20)
    seg.release()


def test_small_dev_shm_is_not_offered(monkeypatch):
    import neo.distributed.shm as shm

    real = os.statvfs("/dev/shm")

    class Small:
        f_frsize, f_bavail = real.f_frsize, (64 << 20) // real.f_frsize       # Docker's default size

    assert shm.shm_supported(), "this machine's /dev/shm should qualify"
    monkeypatch.setattr(os, "statvfs", lambda path: Small())
    assert not shm.shm_supported()


def _failing_setup_body(rank: int, W: int, where: str):
    """``ShmExchange.create`` with ``dist.<where>`` raising (as when a peer died mid-setup): this
    rank's segment files as they were when it raised, and those left afterwards."""
    real_broadcast = dist.broadcast_object_list
    seen = {}

    def broadcast(msg, *args, **kwargs):              # the exchange's name, from rank 0
        real_broadcast(msg, *args, **kwargs)
        seen["base"] = msg[0]

    def mine() -> list:
        files = glob.glob(f"/dev/shm/{seen['base']}-*")
        return sorted(p for p in files if f"{seen['base']}-{rank}-" in p or (rank == 0 and p.endswith("-ctrl")))

    def peer_died(*args, **kwargs):
        seen["at_failure"] = mine()
        raise RuntimeError("a peer died")

    dist.broadcast_object_list = broadcast
    setattr(dist, where, peer_died)
    with pytest.raises(RuntimeError, match="a peer died"):
        ShmExchange.create(dist.group.WORLD, segment_bytes=1 << 20)
    left = mine()
    for path in left:                                 # not left behind by a failing test either
        os.unlink(path)
    return seen["at_failure"], left


@pytest.mark.parametrize("where", ["barrier", "all_gather_object"])
def test_a_failed_setup_leaves_no_segment(where):
    """The setup's barrier or gather raises: every rank unlinks the segments it created."""
    for rank, (at_failure, left) in enumerate(run_multiprocess(_failing_setup_body, 2, where, timeout_s=60)):
        assert len(at_failure) == SLOTS + (rank == 0), at_failure        # its slots (and rank 0's ctrl) existed
        assert left == [], left


def _disagree_body(rank: int, W: int):
    ex = ShmExchange.create(dist.group.WORLD)
    if rank == 0:                     # sends 3 rows to rank 1, which expects 2
        out = torch.empty(2 + 2)
        ex.all_to_all_single(out, torch.zeros(5), [2, 2], [2, 3]).wait()
        return "ok"
    out = torch.empty(2 + 2)
    ex.all_to_all_single(out, torch.zeros(4), [2, 2], [2, 2]).wait()


def test_disagreeing_splits_raise_on_the_receiver():
    with pytest.raises(MultiProcessError) as info:
        run_multiprocess(_disagree_body, 2, collective_timeout_s=10, timeout_s=60)
    assert list(info.value.failures) == [1]
    msg = info.value.failures[1]
    assert "message 1 from rank 0 holds 12 bytes, this rank expected 8" in msg and "disagree on the splits" in msg, msg


def _stall_body(rank: int, W: int):
    pg = ProcessGroups.build()
    assert pg.uses_shm
    if rank == 1:
        time.sleep(8)                 # alive but absent: rank 0's wait must time out, naming rank 1
        return "slept"
    return all_to_all(torch.ones(2), [1, 1], [1, 1], pg.world_comm, name="stalled_a2a").wait()


def test_stalled_peer_times_out_naming_it():
    with pytest.raises(MultiProcessError) as info:
        run_multiprocess(_stall_body, 2, collective_timeout_s=3, grace_s=20, timeout_s=60)
    assert list(info.value.failures) == [0]
    msg = info.value.failures[0]
    assert "CollectiveError" in msg and "rank 0: collective 'stalled_a2a' failed or timed out" in msg, msg
    assert "waiting for rank(s) [1] to send message 1" in msg, msg


def _exit_body(rank: int, W: int, out_path: str):
    import json

    pg = ProcessGroups.build()
    assert pg.uses_shm
    if rank == 1:
        os._exit(3)                   # gone, as a crashed rank is: rank 0 must not wait out the timeout
    t0 = time.monotonic()
    try:
        all_to_all(torch.ones(2), [1, 1], [1, 1], pg.world_comm, name="orphaned_a2a").wait()
        got = ["no error", ""]
    except Exception as e:  # noqa: BLE001 - the test looks at what it is
        got = [type(e).__name__, str(e)]
    with open(out_path, "w") as f:
        json.dump(got + [time.monotonic() - t0], f)


def test_a_peer_that_exited_is_named_at_once(tmp_path):
    """A peer whose process is gone: the wait fails within a fraction of a second (it looks at the
    peers' pids every PEER_CHECK_S), naming it, where the collective timeout is 120 s."""
    import json

    out = str(tmp_path / "rank0.json")
    with pytest.raises(MultiProcessError) as info:
        run_multiprocess(_exit_body, 2, out, collective_timeout_s=120, grace_s=20, timeout_s=60)
    assert list(info.value.failures) == [1], info.value            # rank 1 exited; rank 0 returned
    kind, msg, waited = json.load(open(out))
    assert kind == "CollectiveError", (kind, msg)
    assert "rank(s) 1 (pid " in msg and "exited" in msg and "waiting for rank(s) [1] to send message 1" in msg, msg
    assert waited < 5, waited


def _fallback_body(rank: int, W: int):
    import neo.distributed.shm as shm

    if rank == 1:                     # as if rank 1 were on another host: nobody uses shared memory
        shm.shm_supported = lambda: False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        groups = ProcessGroups.build()
        comm = CommGroup.build(dist.group.WORLD, shm=True, timeout=None)
    if rank == 0:
        assert any("cannot share /dev/shm" in str(w.message) for w in caught), [str(w.message) for w in caught]
    out = all_to_all(torch.arange(4) + 10 * rank, [2, 2], [2, 2], groups.world_comm).wait()
    return groups.uses_shm, comm.shm is None, out.tolist()


def test_ranks_that_cannot_share_memory_fall_back_to_gloo_together():
    got = run_multiprocess(_fallback_body, 2, timeout_s=60)
    assert [g[:2] for g in got] == [(False, True), (False, True)]
    assert got[0][2] == [0, 1, 10, 11] and got[1][2] == [2, 3, 12, 13]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("nbytes", [1000, (1 << 20) - 1, 1 << 20, (3 << 20) + 5])
def test_move_copies_every_byte_whichever_copy_runs(threads, nbytes):
    """Chunks are copied by memmove (small ones; any size on one intra-op thread) or by torch's
    copy (large ones on several threads): either way every byte arrives and nothing past the
    chunk is written, at odd sizes and offsets too."""
    from neo.distributed.shm_segments import _move
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(nbytes + threads)
        src = torch.randint(0, 256, (nbytes + 3,), dtype=torch.uint8, generator=gen)
        dst = torch.zeros(nbytes + 8, dtype=torch.uint8)
        _move(dst.data_ptr() + 2, src.data_ptr() + 1, nbytes)
        assert torch.equal(dst[2:2 + nbytes], src[1:1 + nbytes])
        assert not dst[:2].any() and not dst[2 + nbytes:].any()
    finally:
        torch.set_num_threads(before)
