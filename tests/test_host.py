"""The thread pool the package sets up for TVM (:func:`tvm_roialign.host.use_usable_cores`): its size
and its workers left free to move between cores, checked on the threads of a process that ran a
parallel kernel."""

from __future__ import annotations

import ast
import os
import platform
import subprocess
import sys
import textwrap

import pytest

_POOL_CHECK = textwrap.dedent(
    """
    import os, numpy as np, tvm
    from tvm import te
    from tvm_roialign.host import use_usable_cores
    threads = use_usable_cores()
    n = te.var("n")
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    sch.parallel(sch.get_loops(sch.get_sblock("b"))[0])
    f = tvm.compile(sch.mod, target="llvm")
    x = tvm.runtime.tensor(np.ones(1 << 16, "float32"))
    y = tvm.runtime.tensor(np.zeros(1 << 16, "float32"))
    f(x, y)
    assert float(y.numpy().sum()) == 2.0 * (1 << 16)
    masks = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/status") as status:
            for line in status:
                if line.startswith("Cpus_allowed_list:"):
                    masks.add(line.split(":", 1)[1].strip())
    print(threads, os.environ["TVM_BIND_THREADS"], sorted(masks))
    """
)


def _run(env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "TVM_BIND_THREADS")}
    proc = subprocess.run(
        [sys.executable, "-c", _POOL_CHECK], capture_output=True, text=True, timeout=300,
        env={**env, **env_extra},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc to read thread affinities"
)
def test_the_pools_workers_are_not_pinned_unless_the_user_asks():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one usable core: TVM's pool has no worker to pin")
    threads, bind, masks = _run({"TVM_NUM_THREADS": "2"}).split(" ", 2)
    assert (threads, bind) == ("2", "0")
    # every thread may run on all of the process's cores
    assert len(ast.literal_eval(masks)) == 1, f"some thread is pinned: {masks}"
    threads, bind, masks = _run({"TVM_NUM_THREADS": "2", "TVM_BIND_THREADS": "1"}).split(" ", 2)
    pinned = len(ast.literal_eval(masks)) > 1
    assert bind == "1" and pinned, f"TVM pins its worker when the user asks: {masks}"


_BUILD_CHECK = textwrap.dedent(
    """
    import os, sys
    from tvm import relax
    from tvm_roialign.host import usable_cores
    from tvm_roialign.pipeline import build
    from tvm_roialign.target import parse_target
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(y)
    for target in sys.argv[1:]:
        build(bb.get(), parse_target(target), layout=None)
        print(os.environ.get("TVM_NUM_THREADS"), end=" ")
    print(usable_cores())
    """
)

#: a target of another architecture than this machine's
_CROSS = "aarch64" if platform.machine().lower() in ("x86_64", "amd64") else "llvm -mtriple=x86_64-linux-gnu"


def test_build_for_this_machine_sizes_the_pool():
    """``pipeline.build`` for a target of this machine's architecture sets ``TVM_NUM_THREADS`` to the
    usable cores (not TVM's half of x86's) before its constant folding starts TVM's pool; a cross
    build leaves it alone (built first here)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "TVM_BIND_THREADS")}
    proc = subprocess.run([sys.executable, "-c", _BUILD_CHECK, _CROSS, "llvm"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after_cross, after_host, usable = proc.stdout.split()[-3:]
    assert (after_cross, after_host) == ("None", usable)
