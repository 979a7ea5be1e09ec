"""Where a detector's compile spends its time: one ``compile_detector`` + ``export``, timed by phase.

    python benchmarks/profile_compile.py maskrcnn_resnet50_fpn [--exact] [--out /tmp/m.so]

Prints one table, wall and CPU (user + sys of this process, which another process's load
affects less than wall) per step: importing the package, building the torchvision model,
exporting and importing the graph, each pass of the CPU pipeline (nested passes indented, with
their own calls), TVM's TIR lowering and LLVM code generation (``tirx.build``), linking the VM
executable, and ``export_library`` (LLVM object emission of the kernels, the packed
executable and constants, the system linker). Then the library's size against the model's
fp32 weights. ``--cprofile FILE`` also writes a cProfile of the whole run.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from contextlib import contextmanager

ROWS: list[tuple[int, str, float, float]] = []


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def step(name: str, depth: int = 0):
    index, wall, cpu = len(ROWS), time.perf_counter(), _cpu()
    ROWS.append((depth, name, 0.0, 0.0))  # in the order the steps start
    yield
    ROWS[index] = (depth, name, time.perf_counter() - wall, _cpu() - cpu)


def _wrap(owner, attr: str, name: str, depth: int) -> None:
    """``owner.attr`` timed as a step each call."""
    inner = getattr(owner, attr)

    def timed(*args, **kwargs):
        with step(name, depth):
            return inner(*args, **kwargs)

    setattr(owner, attr, timed)


def _pass_instrument(max_depth: int):
    import tvm

    @tvm.instrument.pass_instrument
    class Timing:
        """Inclusive wall / CPU time of each pass down to ``max_depth`` levels of nesting (each
        thread on its own stack: the kernels' TIR passes run in several at once)."""

        def __init__(self):
            self.local = threading.local()

        @property
        def stack(self):
            if not hasattr(self.local, "stack"):
                self.local.stack = []
            return self.local.stack

        def run_before_pass(self, _mod, info):
            depth = len(self.stack)
            index = len(ROWS)
            if depth <= max_depth:
                ROWS.append((3 + depth, info.name, 0.0, 0.0))
            self.stack.append((index, time.perf_counter(), _cpu()))

        def run_after_pass(self, _mod, _info):
            index, wall, cpu = self.stack.pop()
            if len(self.stack) <= max_depth:
                depth, name = ROWS[index][:2]
                ROWS[index] = (depth, name, time.perf_counter() - wall, _cpu() - cpu)

    return Timing()


def _instrument_export() -> None:
    """Time ``export_library``'s parts: each module's object file, the packed imports, the link."""
    import tvm_ffi
    from tvm.runtime import module as rt_module
    from tvm.support import cc

    _wrap(tvm_ffi.Module, "write_to_file", "write object file (LLVM emission)", 2)
    _wrap(cc, "create_shared", "link (system compiler)", 2)
    _wrap(rt_module._ffi_api, "ModulePackImportsToLLVM", "pack executable + constants", 2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="maskrcnn_resnet50_fpn")
    parser.add_argument("--exact", action="store_true")
    parser.add_argument("--out", default="/tmp/profile_compile.so")
    parser.add_argument("--depth", type=int, default=2, help="pass nesting shown")
    parser.add_argument("--min-s", type=float, default=0.05, help="shortest step shown (CPU s)")
    parser.add_argument("--cprofile", default=None)
    args = parser.parse_args(argv)
    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t_all, c_all = time.perf_counter(), _cpu()
    with step("import tvm_roialign (tvm, torch)"):
        import tvm

        import tvm_roialign  # noqa: F401
        from tvm_roialign.models import detection

    from tvm.relax import vm_build

    _wrap(tvm.tirx, "build", "tirx.build (TIR passes + LLVM codegen)", 2)
    _wrap(vm_build._ffi_api, "VMLink", "VMLink (executable + constants)", 2)
    _instrument_export()
    with step("build torchvision model"):
        model = detection.build_torch_detector(args.model, detection.DetectorConfig())
    weights = sum(p.numel() * 4 for p in model.state_dict().values() if p.is_floating_point())
    with tvm.transform.PassContext(instruments=[_pass_instrument(args.depth)]):
        with step("compile_detector"):
            artifact = detection.compile_detector(model, None, "native", fast=not args.exact)
    with step("export"):
        artifact.export(args.out)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.cprofile)
    ROWS.append((0, "total", time.perf_counter() - t_all, _cpu() - c_all))
    _print(artifact, args, weights)
    return 0


def _print(artifact, args, weights: int) -> None:
    import tvm

    print(f"{args.model} ({artifact.meta['mode']}), {tvm.target.codegen.llvm_get_system_cpu()}, "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"import_s {artifact.import_s:.1f}, compile_s {artifact.compile_s:.1f}")
    print(f"{'step':<64} {'wall s':>8} {'cpu s':>8}")
    for depth, name, wall, cpu in ROWS:
        if depth > 0 and cpu < args.min_s:
            continue
        print(f"{'  ' * depth + name:<64} {wall:8.2f} {cpu:8.2f}")
    size = os.path.getsize(args.out)
    print(f"library {size / 2**20:.1f} MiB; fp32 weights {weights / 2**20:.1f} MiB; "
          f"ratio {size / weights:.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
