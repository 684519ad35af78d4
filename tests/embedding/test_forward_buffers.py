"""The pooled forward lookup's output buffer (csrc/embedding_forward.cpp through
csrc/reused_buffers.h: per-thread slots): handed out again once nobody holds it, never while a
tensor, a view or autograd still does; every output checked against the reference backend.
Each test runs in a thread of its own: the slots are per thread, so it starts with none."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from neo.config.embedding import OptimizerConfig, TableConfig
from neo.embedding import TableBatchedEmbedding
from neo.host_memory import transparent_hugepage_mode

from harness import clone_weights, random_batch

import neo._C as _C  # noqa: F401,E402  (built by tools/setup.sh; a missing build must fail here, not skip)


def in_own_thread(fn):
    with ThreadPoolExecutor(max_workers=1) as pool:   # result() raises here what the thread raised
        return pool.submit(fn).result()


def modules(dim: int = 16, rows: int = 50):
    tables = [TableConfig("a", rows, dim, feature_names=("f1", "f2"), optimizer=OptimizerConfig("sgd", lr=0.1)),
              TableConfig("b", rows, dim, optimizer=OptimizerConfig("sgd", lr=0.1))]
    ref = TableBatchedEmbedding(tables, backend="reference", seed=0)
    fast = TableBatchedEmbedding(tables, backend="cpu", seed=0)
    clone_weights(ref, fast)
    return tables, ref, fast


def test_forward_output_is_reused_only_once_nobody_holds_it():
    """Outputs still held (a tensor, a view) keep their bytes through later calls; a dropped one
    is handed out again, though a tensor of its size allocated in between took whatever chunk
    the allocator had free for it (on the previous code, which allocated every output afresh,
    the call then got another address)."""
    def run():
        tables, ref, fast = modules()
        gen = torch.Generator().manual_seed(1)
        batches = [random_batch(tables, 32, gen) for _ in range(6)]
        with torch.no_grad():
            held = [fast(b) for b in batches[:3]]                # three live outputs
            kept = [o.clone() for o in held]
            view = held[0][:, :4]
            ptr0, nbytes = held[0].data_ptr(), held[0].numel() * 4
            del held[0]                                          # only a view of the first is left
            fast(batches[3])
            assert view.data_ptr() == ptr0
            torch.testing.assert_close(view, kept[0][:, :4], rtol=0, atol=0)
            for o, k in zip(held, kept[1:]):
                torch.testing.assert_close(o, k, rtol=0, atol=0)
            for o, b in zip([view] + held, batches):
                torch.testing.assert_close(o, ref(b)[:, :o.shape[1]], rtol=1e-6, atol=1e-6)

            del view, held                                       # nothing holds any output now
            first = fast(batches[4])
            ptr, nbytes = first.data_ptr(), first.numel() * 4
            torch.testing.assert_close(first, ref(batches[4]), rtol=1e-6, atol=1e-6)
            del first
            filler = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(3)]   # noqa: F841
            again = fast(batches[5])
            assert again.data_ptr() == ptr
            torch.testing.assert_close(again, ref(batches[5]), rtol=1e-6, atol=1e-6)

    in_own_thread(run)


def test_forward_output_saved_by_autograd_is_not_overwritten():
    """A training loop that runs the next forward before the previous backward: the first
    output, saved for the backward by a product, must not be the second call's buffer. The
    gradients of the weights then equal the reference module's on the same two steps."""
    def run():
        tables, ref, fast = modules()
        gen = torch.Generator().manual_seed(2)
        b1, b2 = random_batch(tables, 16, gen), random_batch(tables, 16, gen)
        w1, w2 = torch.randn(16, 3 * 16, generator=gen), torch.randn(16, 3 * 16, generator=gen)
        for m in (ref, fast):
            o1 = m(b1)
            loss1 = (o1 * o1 * w1).sum()          # the product saves o1 for its backward
            o2 = m(b2)                            # before loss1's backward
            loss2 = (o2 * o2 * w2).sum()
            loss1.backward()
            loss2.backward()
        for t in tables:
            torch.testing.assert_close(fast.table_weight(t.name), ref.table_weight(t.name), rtol=1e-5, atol=1e-6)

    in_own_thread(run)


def test_forward_shapes_called_in_turn_keep_a_buffer_each():
    """Two batch sizes called in turn (training and evaluation batches) keep a buffer each: from
    the second round on, each call gets its shape's storage of the first round again, though
    the allocator's freed chunks were taken in between (fillers)."""
    def run():
        tables, ref, fast = modules()
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            def call(B):
                b = random_batch(tables, B, gen)
                out = fast(b)
                torch.testing.assert_close(out, ref(b), rtol=1e-6, atol=1e-6)
                return out.data_ptr(), out.numel() * 4

            first = {B: call(B) for B in (24, 40)}
            fillers = []
            for _ in range(3):
                for B in (24, 40):
                    fillers.append(torch.empty(first[B][1], dtype=torch.uint8))
                    assert call(B) == first[B]

    in_own_thread(run)


def test_large_forward_output_starts_on_a_2mib_boundary():
    """An output of 2 MiB or more starts on a 2 MiB boundary of a padded storage where
    transparent huge pages are available (every page it touches can be a huge one), plain
    elsewhere; the values are the reference's."""
    def run():
        tables, ref, fast = modules(dim=64, rows=200)
        gen = torch.Generator().manual_seed(4)
        b = random_batch(tables, 4096, gen)                   # (4096, 192) fp32: 3 MiB
        with torch.no_grad():
            out = fast(b)
            torch.testing.assert_close(out, ref(b), rtol=1e-6, atol=1e-6)
        if transparent_hugepage_mode() in ("always", "madvise"):
            assert out.data_ptr() % (2 << 20) == 0
            assert out.untyped_storage().nbytes() >= out.numel() * 4 + (2 << 20)
        else:
            assert out.storage_offset() == 0 and out.untyped_storage().nbytes() == out.numel() * 4

    in_own_thread(run)
