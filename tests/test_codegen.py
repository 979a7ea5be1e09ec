"""The kernels built in parallel (tvm_roialign/codegen.py) and their library written in parallel
(tvm_roialign/linking.py): results against float64 NumPy, in memory and from the exported library,
the shares balanced, and the builds that must stay in one piece."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_roialign.codegen import _kernel_sizes, _shares, build_kernels, compile_parallel
from tvm_roialign.linking import export_library
from tvm_roialign.pipeline import cpu_pipeline
from tvm_roialign.runtime import LoadedVM
from tvm_roialign.target import parse_target
from tvm_roialign.testing import run_executable

TARGET = parse_target("llvm")


def _model() -> tvm.IRModule:
    """Six kernels of different sizes: a matmul, a softmax, an exp, a transpose, a sum, a
    convolution."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, 16], "float32"))
    w = relax.const(np.linspace(-1, 1, 16 * 12, dtype="float32").reshape(16, 12))
    k = relax.const(np.linspace(-0.5, 0.5, 4 * 1 * 3 * 3, dtype="float32").reshape(4, 1, 3, 3))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            s = bb.emit(relax.op.nn.softmax(y, axis=-1))
            e = bb.emit(relax.op.exp(relax.op.permute_dims(s)))
            total = bb.emit(relax.op.sum(e, axis=0))
            image = bb.emit(relax.op.reshape(x, [1, 1, 8, 16]))
            conv = bb.emit(relax.op.nn.conv2d(image, k, padding=1))
            out = bb.emit_output(relax.Tuple([total, conv]))
        bb.emit_func_output(out)
    return bb.get()


def _expected(x: np.ndarray):
    x = x.astype(np.float64)
    w = np.linspace(-1, 1, 16 * 12, dtype="float32").reshape(16, 12).astype(np.float64)
    k = np.linspace(-0.5, 0.5, 36, dtype="float32").reshape(4, 3, 3).astype(np.float64)
    y = x @ w
    s = np.exp(y - y.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    total = np.exp(s.T).sum(0)
    padded = np.pad(x, 1)
    conv = np.zeros((1, 4, 8, 16))
    for o in range(4):
        for i in range(3):
            for j in range(3):
                conv[0, o] += k[o, i, j] * padded[i:i + 8, j:j + 16]
    return total, conv


def _check(outputs, x):
    for ours, ref in zip(outputs, _expected(x)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).standard_normal((8, 16)).astype("float32")


def test_shares_are_balanced_and_complete():
    sizes = {tvm.ir.GlobalVar(f"k{i}"): size for i, size in enumerate([90, 50, 40, 30, 20, 10, 5])}
    shares = _shares(sizes, 2)
    assert sorted(g.name_hint for share in shares for g in share) == sorted(g.name_hint for g in sizes)
    totals = sorted(sum(sizes[g] for g in share) for share in shares)
    assert totals == [120, 125]  # largest first, each to the lightest share
    assert len(_shares(sizes, 16)) == len(sizes)  # never an empty share


def test_parallel_build_runs_in_several_modules_and_equals_numpy(x):
    executable = compile_parallel(_model(), TARGET, cpu_pipeline(TARGET), jobs=2)
    kernels = [m for m in executable.mod.imports[0]._collect_dso_modules() if m.kind == "llvm"]
    assert len(kernels) == 2  # the kernels' two shares, the second imported by the first
    _check(run_executable(executable, x), x)


def test_parallel_library_loads_and_equals_numpy(x, tmp_path):
    """The exported library links both shares' objects (written in threads) into one shared
    object: every kernel is found after loading, and the results are NumPy's."""
    executable = compile_parallel(_model(), TARGET, cpu_pipeline(TARGET), jobs=2)
    path = export_library(executable, tmp_path / "m.so", TARGET)
    vm = LoadedVM(tvm.runtime.load_module(str(path)), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    _check([t.numpy() for t in out], x)


def test_one_job_is_tvm_compile(x):
    executable = compile_parallel(_model(), TARGET, cpu_pipeline(TARGET), jobs=1)
    kernels = [m for m in executable.mod._collect_dso_modules() if m.kind == "llvm"]
    assert len(kernels) == 1
    _check(run_executable(executable, x), x)


def test_kernels_that_call_each_other_build_together():
    """A PrimFunc that calls another of the module (a TIR subroutine): no shares, one module."""
    callee_var = tvm.ir.GlobalVar("callee")
    a = tirx.decl_buffer([4], "float32", name="a")
    callee = tirx.PrimFunc([a], tirx.BufferStore(a, tirx.const(1.0, "float32"), [0]))
    callee = callee.with_attr("global_symbol", "callee")
    b = tirx.decl_buffer([4], "float32", name="b")
    caller = tirx.PrimFunc([b], tirx.Evaluate(tvm.ir.Call(callee_var, [b.data], ret_ty="int32")))
    caller = caller.with_attr("global_symbol", "caller")
    mod = tvm.IRModule({callee_var: callee, tvm.ir.GlobalVar("caller"): caller})
    assert _kernel_sizes(mod) is None
    lib = build_kernels(mod, TARGET, jobs=2)
    assert len(lib.imports) == 0


def test_cross_target_tar_holds_every_share(tmp_path):
    """A build for another architecture (AArch64) in two shares exports as a .tar of object files
    (no cross linker needed): both shares' objects and the packed executable, each for AArch64."""
    import tarfile

    target = parse_target("aarch64")
    executable = compile_parallel(_model(), target, cpu_pipeline(target), jobs=2)
    path = export_library(executable, tmp_path / "m.tar", target)
    with tarfile.open(path) as tar:
        names = sorted(tar.getnames())
        objects = [tar.extractfile(name).read() for name in names]
    assert names == ["devc.o", "lib0.o", "lib1.o"]
    for data in objects:
        assert data[:4] == b"\x7fELF" and data[18] == 183  # ELF, e_machine EM_AARCH64
