"""How long DDP's gradient all-reduce ran in a step: a comm hook that does what DDP's default hook does (divide
by the world size, all-reduce the bucket) and times each bucket.

Each bucket's span starts when the hook is called, which on the GPU is an event recorded on the backward's stream
(it completes once that bucket's gradients exist), and ends when the all-reduce has completed (an event recorded
in the future's callback, which runs on a stream that waits for the collective). On the CPU (gloo) both ends are
host clocks: the hook's call and the callback. Buckets are reduced one after another, so the union of the spans is
the time a gradient all-reduce ran or waited for the one before it: the communication time of the step, whether or
not the backward hid it. The part after the last bucket's gradients were ready is the exposed part: what the step
waited for beyond its own compute."""

from __future__ import annotations

from ...measure import timer

METHOD = ("measured: a DDP comm hook (divide + all-reduce, as DDP's default) with each bucket timed from its "
          "gradients being ready to its all-reduce's end (CUDA events; host clock on the CPU); allreduce_ms is the "
          "union of the buckets' spans, allreduce_exposed_ms its part after the last bucket was ready")


def union_ms(spans: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end] intervals."""
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


class GradSyncTimer:
    """Register with `ddp_model.register_comm_hook(None, grad_timer.hook)`; `take()` after each step returns that step's
    (all-reduce ms, exposed ms, bytes reduced) and starts the next."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.spans: list[list] = []
        self.bytes = 0

    def hook(self, state, bucket):
        import torch.distributed as dist

        group = state if state is not None else dist.group.WORLD
        buffer = bucket.buffer()
        self.bytes += buffer.numel() * buffer.element_size()
        buffer.div_(dist.get_world_size(group))  # divided first, as DDP's own hook (no fp16 overflow in the sum)
        span = [timer.mark(self.cuda), None]
        self.spans.append(span)

        def done(fut):
            span[1] = timer.mark(self.cuda)  # on the GPU: on the callback's stream, which waits for the all-reduce
            return fut.value()[0]

        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(done)

    def take(self) -> tuple[float, float, int] | None:
        """(ms of the union of this step's bucket spans, ms after the last bucket was ready, bytes); None when no
        bucket was reduced. On the GPU, call it once the step's work has completed (events are read)."""
        spans, nbytes = [s for s in self.spans if s[1] is not None], self.bytes
        self.spans, self.bytes = [], 0
        if not spans:
            return None
        if self.cuda:
            spans[-1][1].synchronize()
            ref = spans[0][0]
            for s in spans:
                s[1].synchronize()
            times = [(ref.elapsed_time(a), ref.elapsed_time(b)) for a, b in spans]
        else:
            times = [(a * 1e3, b * 1e3) for a, b in spans]
        last_ready = max(a for a, _ in times)
        exposed = max(0.0, max(b for _, b in times) - last_ready)
        return union_ms(times), exposed, nbytes
