"""``compile -v``: the time of each TVM pass of the build, summed by pass name, the longest printed
after the summary (what ``tvmc compile --print-pass-times`` shows, in a table). Measured by a pass
instrument put on the build's ``PassContext``; a nested pass's time is also in its parent's. The
kernels' TIR passes run in several threads at once (:mod:`tvm_roialign.codegen`): each thread's
passes are timed on their own stack, and a pass's seconds are the sum over the threads."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict

#: how many passes ``-v`` prints
SHOWN = 15


class PassTimes:
    """Wall seconds and calls per pass name (summed over the threads that ran it), and the shallowest
    depth it ran at (0: the pipeline's own, or a thread's first)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.depth: dict[str, int] = {}
        self._local = threading.local()
        self._lock = threading.Lock()

    @property
    def _stack(self) -> list[tuple[str, float]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def enter(self, name: str) -> None:
        stack = self._stack
        with self._lock:  # the shallowest it ran at: a thread's TIR passes are in no pass
            self.depth[name] = min(self.depth.get(name, len(stack)), len(stack))
        stack.append((name, time.perf_counter()))

    def leave(self) -> None:
        name, t0 = self._stack.pop()
        with self._lock:
            self.seconds[name] += time.perf_counter() - t0
            self.calls[name] += 1

    def lines(self, shown: int = SHOWN) -> list[str]:
        # TVM's anonymous Sequential containers: the passes they hold are listed themselves
        named = [item for item in self.seconds.items() if item[0] != "sequential"]
        longest = sorted(named, key=lambda item: -item[1])[:shown]
        out = [f"pass times (the {len(longest)} longest of {len(named)} passes; a nested pass, "
               "indented, is also in its parent's time; the kernels' TIR passes (_pipeline and what "
               "it runs) run in several threads at once: their times are summed over the threads):"]
        for name, seconds in longest:
            indent = "  " * min(self.depth[name], 3)
            out.append(f"  {seconds:8.2f} s  {self.calls[name]:5d} x  {indent}{name}")
        return out


def _instrument(times: PassTimes):
    import tvm

    @tvm.ir.instrument.pass_instrument
    class _Timing:
        def run_before_pass(self, mod, info):
            times.enter(info.name)

        def run_after_pass(self, mod, info):
            times.leave()

    return _Timing()


@contextlib.contextmanager
def recorded(enabled: bool):
    """A :class:`PassTimes` filled by the passes run inside (a PassContext carrying its
    instrument, the current context's settings kept), or None when not ``enabled``."""
    if not enabled:
        yield None
        return
    import tvm

    times = PassTimes()
    ctx = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(
        opt_level=ctx.opt_level,
        required_pass=list(ctx.required_pass),
        disabled_pass=list(ctx.disabled_pass),
        config=dict(ctx.config),
        instruments=[*ctx.instruments, _instrument(times)],
    ):
        yield times
