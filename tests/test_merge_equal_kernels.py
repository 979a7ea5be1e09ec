"""MergeEqualKernels: structurally equal PrimFuncs become one, every call points at it, results kept;
in the CPU pipeline, a symbolic model's per-level copies of a kernel are compiled once."""

from __future__ import annotations

import numpy as np
import tvm
from _targets import NATIVE as HOST
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_roialign.passes import MergeEqualKernels
from tvm_roialign.pipeline import build, cpu_pipeline


def _module():
    @I.ir_module
    class Module:
        @T.prim_func(private=True, s_tir=True)
        def add_one(x: T.Buffer((T.int64(4),), "float32"), y: T.Buffer((T.int64(4),), "float32")):
            for i in range(T.int64(4)):
                with T.sblock("y"):
                    v = T.axis.spatial(T.int64(4), i)
                    y[v] = x[v] + T.float32(1.0)

        @T.prim_func(private=True, s_tir=True)
        def add_one_again(a: T.Buffer((T.int64(4),), "float32"), b: T.Buffer((T.int64(4),), "float32")):
            for j in range(T.int64(4)):
                with T.sblock("y"):
                    v = T.axis.spatial(T.int64(4), j)
                    b[v] = a[v] + T.float32(1.0)

        @T.prim_func(private=True, s_tir=True)
        def add_two(x: T.Buffer((T.int64(4),), "float32"), y: T.Buffer((T.int64(4),), "float32")):
            for i in range(T.int64(4)):
                with T.sblock("y"):
                    v = T.axis.spatial(T.int64(4), i)
                    y[v] = x[v] + T.float32(2.0)

        @R.function
        def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
            cls = Module
            with R.dataflow():
                a = R.call_tir(cls.add_one, (x,), out_ty=R.Tensor((4,), "float32"))
                b = R.call_tir(cls.add_one_again, (a,), out_ty=R.Tensor((4,), "float32"))
                c = R.call_tir(cls.add_two, (b,), out_ty=R.Tensor((4,), "float32"))
                R.output(c)
            return c

    return Module


def _prim_names(mod) -> list[str]:
    return sorted(gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def test_equal_kernels_merged_and_calls_redirected():
    mod = _module()
    merged = MergeEqualKernels()(mod)
    # the renamed copy goes, the kernel that differs (+2) stays
    assert _prim_names(merged) == ["add_one", "add_two"]
    assert "add_one_again" not in merged["main"].script()
    x = np.arange(4, dtype=np.float32)
    vm = relax.VirtualMachine(tvm.compile(merged, target=HOST), tvm.cpu())
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), x + 4)


def test_nothing_to_merge_returns_the_module():
    mod = MergeEqualKernels()(_module())
    assert MergeEqualKernels()(mod).same_as(mod)


def _pyramid():
    """Three levels of a 2x2 max-pool and ReLU on a symbolic-size map: the second and third levels'
    fused kernels differ in their extents only (``(h - 2) // 2 + 1`` and the same of that) until the
    rules name them; the first reads the input's own variables."""
    bb = relax.BlockBuilder()
    h, w = tvm.tirx.Var("h", "int64"), tvm.tirx.Var("w", "int64")
    x = relax.Var("x", relax.TensorType([1, h, w, 16], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            level = x
            outs = []
            for _ in range(3):
                pooled = bb.emit(relax.op.nn.max_pool2d(level, 2, 2, layout="NHWC"))
                level = bb.emit(relax.op.nn.relu(pooled))
                outs.append(level)
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def test_pipeline_compiles_per_level_copies_once():
    mod = _pyramid()
    with HOST:
        lowered = cpu_pipeline(HOST)(mod)
    levels = [n for n in _prim_names(lowered) if "max_pool2d" in n]
    assert len(levels) == 2, _prim_names(lowered)
    vm = relax.VirtualMachine(build(mod, HOST).executable, tvm.cpu())
    for height, width in ((24, 40), (16, 8)):
        x = np.random.default_rng(0).standard_normal((1, height, width, 16)).astype(np.float32)
        outs = vm["main"](tvm.runtime.tensor(x))
        level = x
        for out in outs:
            n, h, w, c = level.shape
            level = np.maximum(level.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4)), 0)
            np.testing.assert_array_equal(out.numpy(), level)
