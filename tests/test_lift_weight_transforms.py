"""Winograd weights computed when a library is loaded (``weights_at_load``,
:class:`tvm_roialign.passes.LiftWeightTransforms`): the library stores the 3x3 weights only, its
``load_weights`` computes the transforms, and :class:`tvm_roialign.runtime.LoadedVM` passes them;
the results against a float64 NumPy convolution and against the build that stores them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
from _targets import NATIVE as HOST
from tvm import relax, te

from tvm_roialign.pipeline import build
from tvm_roialign.runtime import LoadedVM
from tvm_roialign.topi.winograd import transform_weight, weight_transform, weight_transform_terms

CHANNELS = (64, 96, 128)  # two 3x3 convs, both taken by Winograd (>= 64 channels, enough tiles)


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((3, 3, cin, cout)) * 0.1).astype("float32")
        for cin, cout in itertools.pairwise(CHANNELS)
    ]


def _module(weights, height=28, width=32, symbolic=False):
    """NHWC ``conv3x3 -> relu -> conv3x3 -> + 1x1 conv of the input`` (the 1x1 is no Winograd
    conv: it stays a stored constant beside the lifted ones)."""
    rng = np.random.default_rng(1)
    skip = (rng.standard_normal((1, 1, CHANNELS[0], CHANNELS[-1])) * 0.1).astype("float32")
    h, w = (tvm.tirx.Var("h", "int64"), tvm.tirx.Var("w", "int64")) if symbolic else (height, width)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, h, w, CHANNELS[0]], "float32"))
    conv = dict(data_layout="NHWC", kernel_layout="HWIO")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(weights[0]), padding=1, **conv))
            y = bb.emit(relax.op.nn.relu(y))
            y = bb.emit(relax.op.nn.conv2d(y, relax.const(weights[1]), padding=1, **conv))
            y = bb.emit(relax.op.add(y, relax.op.nn.conv2d(x, relax.const(skip), **conv)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), skip


def _direct(x, weights, skip):
    """The module's float64 reference: direct convolutions by shifted sums."""

    def conv3x3(a, w):
        n, h, wd, _ = a.shape
        padded = np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)))
        out = np.zeros((n, h, wd, w.shape[3]))
        for i in range(3):
            for j in range(3):
                out += padded[:, i : i + h, j : j + wd, :] @ w[i, j]
        return out

    x = x.astype("float64")
    y = np.maximum(conv3x3(x, weights[0].astype("float64")), 0)
    return conv3x3(y, weights[1].astype("float64")) + x @ skip[0, 0].astype("float64")


def _library(tmp_path, mod, name, **options):
    path = tmp_path / f"{name}.so"
    build(mod, HOST, layout=None, **options).executable.export_library(str(path))
    return path


@pytest.mark.parametrize("tile", [4, 5])
def test_weight_transform_kernel_matches_the_compile_time_transform(tile):
    """The load-time kernel against ``transform_weight`` (NumPy, float64, another summation
    order): each point within one float32 rounding of it."""
    weight = _weights()[0]
    terms = weight_transform_terms(tile)
    w = te.placeholder((9, *weight.shape[2:]), "float32", "w")
    t = te.placeholder(terms.shape, "float64", "t")
    func = te.create_prim_func([w, t, weight_transform(w, t)])
    kernel = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    out = tvm.runtime.empty((terms.shape[0], *weight.shape[2:]), "float32")
    kernel(tvm.runtime.tensor(weight.reshape(9, *weight.shape[2:])), tvm.runtime.tensor(terms), out)
    expected = transform_weight(weight, tile)
    np.testing.assert_array_max_ulp(out.numpy(), expected, maxulp=1)
    # and a different weight gives a different transform (the kernel reads its input)
    assert not np.allclose(out.numpy(), transform_weight(_weights(seed=5)[0], tile))


@pytest.mark.parametrize("tile", [4, 5])
def test_library_stores_3x3_weights_and_computes_the_transforms_at_load(tmp_path, tile):
    weights = _weights()
    mod, skip = _module(weights)
    stored = _library(tmp_path, mod, "stored", winograd=tile)
    lifted = _library(tmp_path, mod, "lifted", winograd=tile, weights_at_load=True)
    # what the lifted library no longer holds: the transforms minus the 3x3 weights they come from
    points = (tile + 2) ** 2
    saved = sum(w[0, 0].size * (points - 9) * 4 for w in weights)
    assert stored.stat().st_size - lifted.stat().st_size > 0.9 * saved

    x = np.random.default_rng(2).standard_normal((1, 28, 32, CHANNELS[0])).astype("float32")
    expected = _direct(x, weights, skip)
    vm = LoadedVM(tvm.runtime.load_module(str(lifted)), tvm.cpu())
    assert len(vm.weights) == 2  # the two Winograd convs' weights; the 1x1 stays stored
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=0, atol=3e-5 * scale)
    plain = LoadedVM(tvm.runtime.load_module(str(stored)), tvm.cpu())
    assert plain.weights == ()
    np.testing.assert_allclose(got, plain["main"](tvm.runtime.tensor(x)).numpy(), rtol=0, atol=3e-5 * scale)

    # relax's own VM sees the contract: main takes the weights after its input
    raw = relax.VirtualMachine(tvm.runtime.load_module(str(lifted)), tvm.cpu())
    with pytest.raises(Exception, match=r"expects 3 arguments"):
        raw["main"](tvm.runtime.tensor(x))
    weights_now = list(raw["load_weights"]())
    np.testing.assert_array_equal(raw["main"](tvm.runtime.tensor(x), *weights_now).numpy(), got)


def test_loaded_vm_passes_the_weights_to_every_way_of_calling(tmp_path):
    mod, _ = _module(_weights())
    path = _library(tmp_path, mod, "lifted", weights_at_load=True)
    vm = LoadedVM(tvm.runtime.load_module(str(path)), tvm.cpu())
    x = np.random.default_rng(3).standard_normal((1, 28, 32, CHANNELS[0])).astype("float32")
    x = tvm.runtime.tensor(x)
    expected = vm["main"](x).numpy()
    vm.set_input("main", x)
    vm.invoke_stateful("main")
    np.testing.assert_array_equal(vm.get_outputs("main").numpy(), expected)
    assert vm.time_evaluator("main", tvm.cpu(), number=1)(x).mean > 0
    # the stateful form: set_input's inputs (with the weights), timed through invoke_stateful
    assert vm.time_evaluator("invoke_stateful", tvm.cpu(), number=1)("main").mean > 0
    vm.save_function("main", "saved", x)
    np.testing.assert_array_equal(vm["saved"]().numpy(), expected)


def test_symbolic_size_library_lifts_its_weights(tmp_path):
    """A conv of symbolic height and width (a detector's any-size library) is lifted too."""
    weights = _weights(seed=4)
    mod, skip = _module(weights, symbolic=True)
    path = _library(tmp_path, mod, "any", weights_at_load=True, reference_side=64)
    vm = LoadedVM(tvm.runtime.load_module(str(path)), tvm.cpu())
    assert len(vm.weights) == 2
    for h, w in [(17, 23), (32, 40)]:
        x = np.random.default_rng(h).standard_normal((1, h, w, CHANNELS[0])).astype("float32")
        expected = _direct(x, weights, skip)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=3e-5 * np.abs(expected).max())


def test_a_library_without_winograd_convs_is_unchanged(tmp_path):
    mod, _ = _module(_weights())
    path = _library(tmp_path, mod, "exact", winograd=0, weights_at_load=True)
    vm = LoadedVM(tvm.runtime.load_module(str(path)), tvm.cpu())
    assert vm.weights == () and not vm.module.implements_function("load_weights")
    x = np.random.default_rng(6).standard_normal((1, 28, 32, CHANNELS[0])).astype("float32")
    raw = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(),
                                  raw["main"](tvm.runtime.tensor(x)).numpy())


def test_a_public_function_calling_another_passes_the_weights_on(tmp_path):
    """A detector's ``detect_photo`` calls ``detect``: both take the weights, the call passes
    them."""
    weights = _weights(seed=7)
    mod, skip = _module(weights)
    main = mod.get_global_var("main")
    bb = relax.BlockBuilder(mod)
    x = relax.Var("x", relax.TensorType([1, 28, 32, CHANNELS[0]], "float32"))
    with bb.function("twice", [x]):
        with bb.dataflow():
            y = bb.emit(relax.Call(main, [x]))
            out = bb.emit_output(relax.op.multiply(y, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    vm = LoadedVM(tvm.runtime.load_module(str(_library(tmp_path, bb.get(), "calls", weights_at_load=True))),
                  tvm.cpu())
    data = np.random.default_rng(8).standard_normal((1, 28, 32, CHANNELS[0])).astype("float32")
    expected = 2 * _direct(data, weights, skip)
    got = vm["twice"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=3e-5 * np.abs(expected).max())


def test_loaded_vm_on_a_remote_device(tmp_path, rpc_server):
    """Over TVM RPC (an x86 server on loopback, as a board runs): ``load_weights`` runs there, its
    tensors stay there and go with every call (``run``'s stateful interface)."""
    from tvm_roialign import remote

    weights = _weights(seed=9)
    mod, skip = _module(weights)
    path = _library(tmp_path, mod, "remote", weights_at_load=True)
    session = remote.connect(rpc_server())
    try:
        device = remote.remote_device(session)
        vm = remote.load_vm(session, path, device, LoadedVM)
        assert len(vm.weights) == 2
        data = np.random.default_rng(10).standard_normal((1, 28, 32, CHANNELS[0])).astype("float32")
        got = remote.run_vm(vm, [tvm.runtime.tensor(data, device)]).numpy()
    finally:
        remote.close(session)
    expected = _direct(data, weights, skip)
    np.testing.assert_allclose(got, expected, rtol=0, atol=3e-5 * np.abs(expected).max())
