"""The fused dot interaction's output and gradient buffers (csrc/interaction.cpp through
csrc/reused_buffers.cpp: per-thread slots, reused_or_empty, new_buffer): handed out again only
once nobody holds them, one per shape called in turn, large ones on 2 MiB boundaries; every
result checked against the torch path."""

import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

from neo.host_memory import transparent_hugepage_mode
from neo.models import DotInteraction

def test_fused_dot_interaction_reuses_only_the_buffers_nobody_holds():
    """The fused kernel hands out the same output and gradient storage again once the caller
    has dropped it (csrc/reused_buffers.cpp, reused_or_empty), never while a tensor or a view of
    it is alive; and the reused gradient still becomes ``.grad`` as is (no copy)."""
    torch.manual_seed(4)
    F, D, B = 26, 16, 8
    m, ref = DotInteraction(F, D), DotInteraction(F, D, kernel="torch")

    def step(seed):
        g = torch.Generator().manual_seed(seed)
        dense = torch.randn(B, D, generator=g, requires_grad=True)
        pooled = torch.randn(B, F * D, generator=g, requires_grad=True)
        grad = torch.randn(B, D + ref.out_features - D, generator=g)
        out = m(dense, pooled)
        out.backward(grad)
        return out.detach(), dense, pooled, grad

    held = [step(s) for s in range(3)]                   # three live outputs: more than the two slots
    kept = [(o.clone(), d.grad.clone(), p.grad.clone()) for o, d, p, _ in held]
    view = held[0][2].grad.view(-1)
    held[0][2].grad = None                               # only a view of the first pooled gradient is left
    step(3)
    for (out, dense, pooled, grad), (o, gd, gp) in zip(held, kept):
        torch.testing.assert_close(out, o, rtol=0, atol=0)
        torch.testing.assert_close(dense.grad, gd, rtol=0, atol=0)
        if pooled.grad is not None:
            torch.testing.assert_close(pooled.grad, gp, rtol=0, atol=0)
    torch.testing.assert_close(view, kept[0][2].view(-1), rtol=0, atol=0)
    for out, dense, pooled, grad in held:                # the torch path on the same inputs
        d, p = dense.detach().requires_grad_(), pooled.detach().requires_grad_()
        r = ref(d, p)
        r.backward(grad)
        torch.testing.assert_close(out, r.detach(), rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(dense.grad, d.grad, rtol=1e-5, atol=1e-5)

    seen = {p.grad.data_ptr() for _, _, p, _ in held if p.grad is not None} | {view.data_ptr()}
    del out, dense, pooled, held, view, r, d, p          # nothing holds any of the gradients any more
    _, _, pooled, _ = step(6)
    assert pooled.grad.data_ptr() in seen                # reused, and taken as .grad without a copy


def test_fused_dot_interaction_keeps_a_buffer_per_shape_called_in_turn():
    """Two shapes called in turn (two modules, or training and evaluation batches) keep a slot
    each (csrc/reused_buffers.cpp, reused_or_empty): from the second round on, every call gets its
    shape's output and gradient storage of the first round again, though the allocator's chunks
    freed in between are taken (the filler tensors), and the results stay right. In a thread of
    its own: the slots are per thread, so it starts with none, whatever ran before."""
    F, B = 26, 8
    mods = {D: DotInteraction(F, D) for D in (16, 32)}
    refs = {D: DotInteraction(F, D, kernel="torch") for D in (16, 32)}

    def call(D, seed):
        g = torch.Generator().manual_seed(seed)
        dense = torch.randn(B, D, generator=g, requires_grad=True)
        pooled = torch.randn(B, F * D, generator=g, requires_grad=True)
        grad = torch.randn(B, mods[D].out_features, generator=g)
        out = mods[D](dense, pooled)
        out.backward(grad)
        d, p = dense.detach().requires_grad_(), pooled.detach().requires_grad_()
        r = refs[D](d, p)
        r.backward(grad)
        torch.testing.assert_close(out, r, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(pooled.grad, p.grad, rtol=1e-5, atol=1e-5)
        return out.data_ptr(), pooled.grad.data_ptr(), out.numel() * 4, pooled.numel() * 4

    def rounds():
        first = {D: call(D, D) for D in (16, 32)}
        fillers = []
        for seed in range(3):
            for D in (16, 32):
                # a tensor of each buffer's size takes whatever chunk the allocator has free for it
                fillers += [torch.empty(first[D][2], dtype=torch.uint8), torch.empty(first[D][3], dtype=torch.uint8)]
                assert call(D, 100 + seed)[:2] == first[D][:2]

    with ThreadPoolExecutor(max_workers=1) as pool:   # result() raises here what the thread raised
        pool.submit(rounds).result()


def test_fused_dot_interaction_puts_large_buffers_on_2mib_boundaries():
    """Output buffers of 2 MiB or more (csrc/reused_buffers.cpp, new_buffer) start on a 2 MiB
    boundary inside a padded storage where transparent huge pages are available, so that
    every page they touch can be a huge one; the results stay those of the torch path, the
    buffer is handed out again once dropped (at its offset), and a call of another size that
    fits the same padded storage takes it too. Where THP is unavailable, plain buffers."""
    F, D = 26, 64
    m, ref = DotInteraction(F, D), DotInteraction(F, D, kernel="torch")
    huge = transparent_hugepage_mode() in ("always", "madvise")

    def call(B, seed):
        g = torch.Generator().manual_seed(seed)
        dense = torch.randn(B, D, generator=g, requires_grad=True)
        pooled = torch.randn(B, F * D, generator=g, requires_grad=True)
        grad = torch.randn(B, m.out_features, generator=g)
        out = m(dense, pooled)
        out.backward(grad)
        d, p = dense.detach().requires_grad_(), pooled.detach().requires_grad_()
        r = ref(d, p)
        r.backward(grad)
        torch.testing.assert_close(out, r, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(dense.grad, d.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pooled.grad, p.grad, rtol=1e-5, atol=1e-5)
        return pooled.grad.data_ptr(), pooled.grad.storage_offset(), pooled.grad.untyped_storage().nbytes()

    def rounds():
        ptr, offset, nbytes = call(512, 1)                 # a 3.25 MiB pooled gradient
        if huge:
            assert ptr % (2 << 20) == 0 and nbytes >= 512 * F * D * 4 + (2 << 20)
        else:
            assert offset == 0 and nbytes == 512 * F * D * 4
        assert call(512, 2)[0] == ptr                      # dropped, handed out again
        assert call(500, 3)[0] == ptr or not huge          # 3.17 MiB: the same 4 MiB of pages

    with ThreadPoolExecutor(max_workers=1) as pool:        # its own thread: its own slots
        pool.submit(rounds).result()


def test_fused_dot_interaction_reuses_a_buffer_python_saw_but_not_one_it_still_refers_to():
    """A storage whose Python object was made (``untyped_storage()``: torch.save, saved-tensor
    hooks) and then dropped is handed out again (csrc/reused_buffers.cpp, held_by_slot_alone:
    before, it stayed in its slot for good); one the caller still holds through that object,
    or through a weak reference (``StorageWeakRef``, as torch.multiprocessing keeps, or Python's
    ``weakref.ref`` to that object), is not,
    and its bytes stay as they were. In a thread of its own: the slots are per thread."""
    from torch.multiprocessing.reductions import StorageWeakRef

    F, D, B = 26, 16, 8
    m, ref = DotInteraction(F, D), DotInteraction(F, D, kernel="torch")

    def call(seed):
        g = torch.Generator().manual_seed(seed)
        dense, pooled = torch.randn(B, D, generator=g), torch.randn(B, F * D, generator=g)
        with torch.no_grad():
            out = m(dense, pooled)
            torch.testing.assert_close(out, ref(dense, pooled), rtol=1e-6, atol=1e-5)
        return out

    def rounds():
        out = call(0)
        first = out.data_ptr()
        out.untyped_storage()                   # its Python object made, and dropped at once
        del out
        out = call(1)
        assert out.data_ptr() == first          # handed out again

        held, kept = out.untyped_storage(), out.clone()
        del out                                 # the storage now held through its Python object alone
        outs = [call(2 + k) for k in range(3)]  # more calls than slots, each output kept
        assert first not in {o.data_ptr() for o in outs}
        torch.testing.assert_close(torch.empty(0).set_(held, 0, kept.shape), kept, rtol=0, atol=0)
        del outs, held

        out = call(5)
        weak, ptr, kept = StorageWeakRef(out.untyped_storage()), out.data_ptr(), out.clone()
        del out                                 # a weak reference left, nothing else
        outs = [call(6 + k) for k in range(3)]
        assert ptr not in {o.data_ptr() for o in outs}
        assert not weak.expired()               # still alive in its slot: its bytes untouched
        torch.testing.assert_close(torch.empty(0).set_(torch.UntypedStorage._new_with_weak_ptr(weak.cdata), 0,
                                                      kept.shape), kept, rtol=0, atol=0)
        del outs, weak

        out = call(9)
        pyweak, ptr, kept = weakref.ref(out.untyped_storage()), out.data_ptr(), out.clone()
        del out                                 # a Python weak reference to its Python object left
        outs = [call(10 + k) for k in range(3)]
        assert ptr not in {o.data_ptr() for o in outs}
        torch.testing.assert_close(torch.empty(0).set_(pyweak(), 0, kept.shape), kept, rtol=0, atol=0)
        del outs, pyweak                        # nothing left: handed out again
        assert call(13).data_ptr() == ptr

    with ThreadPoolExecutor(max_workers=1) as pool:   # result() raises here what the thread raised
        pool.submit(rounds).result()
