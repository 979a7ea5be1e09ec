"""The one legalization of both ops (``tvm_roialign.ops._legalize``): the strategy comes from the
call's ``vdevice`` first (as TVM's ``BackendDispatcher``), else the current target, else the host."""

from __future__ import annotations

import pytest
import tvm
from _targets import GENERIC
from tvm import relax

import tvm_roialign
from tvm_roialign.ops._legalize import call_target
from tvm_roialign.testing import single_op_module

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
LLVM = GENERIC
FEATURES = [(1, 8, 16, 16), (1, 8, 8, 8)]


def _heterogeneous_module():
    """``main``: each op twice, once with every tensor on a CUDA vdevice, once on an llvm one."""
    devices = {"cuda": relax.VDevice(CUDA, 0, "global"), "llvm": relax.VDevice(LLVM, 0, "global")}
    inputs = {}
    for kind, vdevice in devices.items():
        for i, shape in enumerate(FEATURES):
            inputs[f"{kind}_f{i}"] = relax.TensorType(list(shape), "float32", vdevice)
        inputs[f"{kind}_rois"] = relax.TensorType([3, 5], "float32", vdevice)

    def build(cf0, cf1, crois, lf0, lf1, lrois):
        return [
            relax.op.vision.roi_align(cf0, crois, (2, 2), 0.5, 2),
            tvm_roialign.multiscale_roi_align([cf0, cf1], crois, 2, [0.5, 0.25], sampling_ratio=2),
            relax.op.vision.roi_align(lf0, lrois, (2, 2), 0.5, 2),
            tvm_roialign.multiscale_roi_align([lf0, lf1], lrois, 2, [0.5, 0.25], sampling_ratio=2),
        ]

    mod = single_op_module(build, **inputs)
    mod.update_global_info("vdevice", list(devices.values()))
    return mod


def _prim_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_vdevice_chooses_the_strategy():
    """A call on a CUDA vdevice gets the CUDA schedule (threads bound) while the context is llvm;
    the llvm calls get the CPU schedule. Each PrimFunc carries its target and is named after it,
    and the output keeps the vdevice."""
    mod = _heterogeneous_module()
    outputs = mod["main"].ret_ty.fields
    assert [str(t.vdevice.target.kind.name) for t in outputs] == ["cuda", "cuda", "llvm", "llvm"]
    with LLVM:
        legalized = relax.transform.LegalizeOps()(mod)
    funcs = _prim_funcs(legalized)
    assert sorted(funcs) == ["multiscale_roi_align_nchw_cuda", "multiscale_roi_align_nchw_llvm",
                             "roi_align_nchw_cuda", "roi_align_nchw_llvm"]
    for name, func in funcs.items():
        kind = name.rsplit("_", 1)[1]
        assert func.attrs["target"].kind.name == kind
        assert ("blockIdx.x" in func.script()) == (kind == "cuda"), name
        assert ("T.parallel" in func.script()) == (kind == "llvm"), name


def test_heterogeneous_module_compiles():
    tvm.compile(_heterogeneous_module(),
                target=tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm"))


def _plain_call():
    mod = single_op_module(lambda d, r: relax.op.vision.roi_align(d, r, (2, 2), 0.5, 2),
                           data=([1, 8, 16, 16], "float32"), rois=([3, 5], "float32"))
    return mod, mod["main"].body.blocks[0].bindings[0].value


def test_target_without_vdevice_is_the_context_else_the_host():
    mod, call = _plain_call()
    with CUDA:
        assert call_target(call).kind.name == "cuda"
        legalized = relax.transform.LegalizeOps()(mod)
    ((name, func),) = _prim_funcs(legalized).items()
    assert name == "roi_align_nchw"  # no vdevice: stock TVM's naming, no target attribute
    assert "blockIdx.x" in func.script() and "target" not in func.attrs
    assert tvm.target.Target.current(allow_none=True) is None
    assert call_target(call).kind.name == "llvm"


def test_unsupported_target_is_refused_clearly():
    mod, _ = _plain_call()
    with tvm.target.Target({"kind": "opencl"}), pytest.raises(ValueError,
                                                               match="unsupported target"):
        relax.transform.LegalizeOps()(mod)
