"""ONNX QDQ models (ONNX Runtime's ``quantize_static``): their quantized convs and matmuls as our int8
contractions with the model's own scales where the target has int8 kernels, else as imported
(fake-quant float); either way equal to the QDQ graph's float semantics.

The net of tests/_qdq.py (an RGB stem, which stays fake-quant, a 1x1 conv, a 3x3 conv with a
residual add, pooling, a linear layer) is quantized three ways: uint8 activations, int8 activations,
and uint8 with ONNX Runtime's ``reduce_range`` (weights within +-64). References: the QDQ graph
evaluated in float64 NumPy (tests/_qdq.py), ONNX Runtime's own evaluation of it as written (graph
optimizations off: QuantizeLinear, DequantizeLinear and float Conv), and, for the ``reduce_range``
model, ONNX Runtime's int8 kernels (its default optimizations fuse QDQ into QLinearConv and friends).
With full 8-bit weights those kernels on a CPU without VNNI (this AVX2 Zen 3) add pairs of u8 x s8
products in saturating int16 (``vpmaddubsw``) and were measured up to 7 output quanta off the
float64 graph; with ``reduce_range`` weights they equal it, and so do ours, which take such a model
on AVX2 (8-bit weights stay fake-quant there).

Tolerance: :data:`QUANTA` steps of the output's quantization. The output is the last
``DequantizeLinear``'s, on a grid of its scale; every QuantizeLinear on the way rounds, and where a
value lies within fp32 rounding of a rounding boundary, fp32 (ours, ONNX Runtime) and float64 take
different steps, which the later layers carry on. Measured: at most 1 quantum over 8 inputs, 98.75%
of the outputs equal.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx
import tvm
from _board import TARGET as BOARD_TARGET
from _board import board_address, require_cross_linker
from _cli import one_line_error, run_cli
from _qdq import evaluate_float64, inputs, output_scale, qdq_model
from tvm import relax

import tvm_roialign
from tvm_roialign import remote
from tvm_roialign.frontend.onnx import from_onnx
from tvm_roialign.linking import export_library
from tvm_roialign.passes import ConvertLayoutWherePossible, QDQContractions, desired_layouts
from tvm_roialign.passes._mutator import const_value, tensor_shape
from tvm_roialign.passes.qdq_contractions import qdq_weight_peak
from tvm_roialign.pipeline import build
from tvm_roialign.pipeline_phases import prepare_pipeline
from tvm_roialign.precision import qdq_note, resolve
from tvm_roialign.target import parse_target
from tvm_roialign.testing import run_first
from tvm_roialign.topi.int8_contraction import TILE_N

#: output quanta the builds may differ from the references by (module docstring)
QUANTA = 2
#: AVX2 without VNNI: int8 kernels for weights within +-64 only, and a library this machine runs
AVX2_ONLY = parse_target("llvm -mcpu=haswell")
#: AVX without AVX2: no int8 kernels (the fake-quant fallback), a library this machine runs
NO_INT8 = parse_target("llvm -mcpu=sandybridge")
INT8_TARGETS = {
    "amx": "llvm -mcpu=sapphirerapids",
    "avx512vnni": "llvm -mcpu=cascadelake",
    "avxvnni": "llvm -mcpu=alderlake",
    "usdot": "llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod,+i8mm",
    "sdot": "llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod",
}
VARIANTS = {"u8": ("uint8", False), "s8": ("int8", False), "u8_reduce_range": ("uint8", True)}
#: the layers the pass takes: (ONNX node's weight initializer, its input's QuantizeLinear scale)
TAKEN = ("a.weight", "b.weight", "fc.weight")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """variant -> (path, imported module, inputs, float64 outputs, output quantum)."""
    folder = tmp_path_factory.mktemp("qdq")
    found = {}
    for name, (activations, reduce_range) in VARIANTS.items():
        path = qdq_model(folder, activations, reduce_range)
        xs = inputs()
        mod = from_onnx(onnx.load(path), keep_params_in_input=False)
        found[name] = (path, mod, xs, [evaluate_float64(path, x) for x in xs], output_scale(path))
    return found


def _ort(path: str, xs, kernels: bool) -> list[np.ndarray]:
    """ONNX Runtime's outputs: its int8 kernels (``kernels``) or the graph as written."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if not kernels:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return [session.run(None, {"x": x})[0] for x in xs]


def _assert_within_quanta(actual, expected, quantum: float, what: str) -> None:
    steps = max(float(np.abs(a - e).max()) for a, e in zip(actual, expected)) / quantum
    assert steps <= QUANTA + 1e-3, f"{what}: {steps:.3f} output quanta off"


def _run(executable, xs) -> list[np.ndarray]:
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return [run_first(vm, x) for x in xs]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fake_quant_build_matches_the_qdq_graph(models, variant):
    """A target without int8 kernels: the model as imported, with a warning; against float64,
    ONNX Runtime's evaluation of the graph and (``reduce_range``) ONNX Runtime's int8 kernels."""
    path, mod, xs, reference, quantum = models[variant]
    with pytest.warns(UserWarning, match=r"quantized \(ONNX QDQ\) model: .* no int8 kernels"):
        actual = _run(build(mod, NO_INT8).executable, xs)
    _assert_within_quanta(actual, reference, quantum, "float64")
    _assert_within_quanta(actual, _ort(path, xs, kernels=False), quantum, "onnxruntime (graph)")
    if variant == "u8_reduce_range":
        _assert_within_quanta(actual, _ort(path, xs, kernels=True), quantum, "onnxruntime (int8)")


def _int8_calls(mod: tvm.IRModule) -> list:
    """``(function name, packed weights, scale)`` of each int8 contraction call of ``main``."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            name = expr.args[0].name_hint
            if name.startswith("int8_"):
                _, packed, _, scale = (const_value(a) for a in expr.args[1].fields)
                found.append((name, packed, scale))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def _unpacked(packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """``[K, N]`` int8 of :func:`~tvm_roialign.topi.int8_contraction.pack_weight_quads`'s layout."""
    blocks, quads = packed.shape[:2]
    return packed.transpose(1, 3, 0, 2).reshape(quads * 4, blocks * TILE_N)[:k, :n]


def _expected_layers(path: str) -> dict:
    """ONNX's int8 weight ``[K, N]`` (our reduction order) and ``s_x * s_w`` of each taken layer."""
    model = onnx.load(path)
    values = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    made_by = {out: node for node in model.graph.node for out in node.output}
    layers = {}
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm"):
            continue
        weight_dq = made_by[node.input[1]]
        name = weight_dq.input[0].removesuffix("_quantized")
        if name not in TAKEN:
            continue
        q = values[weight_dq.input[0]]
        matrix = q.transpose(2, 3, 1, 0).reshape(-1, q.shape[0]) if q.ndim == 4 else q.T  # HWIO / transB
        s_x = values[made_by[node.input[0]].input[1]]
        layers[name] = (matrix, np.float32(s_x) * values[weight_dq.input[1]].astype(np.float32))
    return layers


@pytest.mark.parametrize("variant", ["u8", "s8"])
def test_rewrite_takes_the_model_int8_weights_and_scales(models, variant):
    """The pass's output: three int8 contractions (the RGB stem stays fake-quant), each with the
    model's int8 weight values as they are and the scale ``s_x * s_w`` of its layer; no dequantize
    of those weights is left (target-independent: the pass runs where a target has int8 kernels)."""
    path, mod, *_ = models[variant]
    converted = ConvertLayoutWherePossible(desired_layouts("NHWC"))(mod)
    rewritten = QDQContractions()(converted)
    calls = _int8_calls(rewritten)
    assert [name.rstrip("0123456789") for name, *_ in calls] == ["int8_conv2d", "int8_conv2d", "int8_matmul"]
    expected = _expected_layers(path)
    for (_, packed, scale), (matrix, layer_scale) in zip(calls, expected.values()):
        np.testing.assert_array_equal(_unpacked(packed, *matrix.shape), matrix)
        np.testing.assert_array_equal(scale[: matrix.shape[1]], layer_scale)
    text = rewritten["main"].script(show_meta=False)
    assert text.count("R.nn.conv2d(") == 1 and "R.matmul(" not in text  # the stem only
    assert text.count("R.dequantize(metadata") == 1 + 4  # the stem's weight, the four biases


def _qdq_operand_shapes(mod: tvm.IRModule) -> tuple[list, list]:
    """The 4-D data shapes of ``main``'s quantize / dequantize calls: of activations, of constants."""
    activations, constants = [], []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") in ("relax.quantize",
                                                                              "relax.dequantize"):
            data = expr.args[0]
            shape = [int(v) for v in data.ty.shape.values]
            if len(shape) == 4:
                (constants if isinstance(data, tvm.ir.expr.Constant) else activations).append(shape)

    relax.analysis.post_order_visit(mod["main"], visit)
    return activations, constants


def test_activations_are_quantized_channels_last(models):
    """The layout rule of per-tensor ``relax.quantize`` / ``relax.dequantize``
    (:mod:`tvm_roialign.passes.layout_qdq`; stock TVM has none, so each pair read its feature map
    transposed back to NCHW and again to NHWC after it: resnet50 quantized by ONNX Runtime ran at
    twice the time): after the conversion to NHWC each activation's pair reads the conv's NHWC
    output (the model's input stays as given); the weights' per-channel dequantize keeps OIHW.
    Results: the builds of the other tests (float64, ONNX Runtime)."""
    from tvm_roialign import _registry
    from tvm_roialign.passes import layout_qdq

    _, mod, *_ = models["u8"]
    converted = ConvertLayoutWherePossible(desired_layouts("NHWC"))(mod)
    activations, weights = _qdq_operand_shapes(converted)
    assert activations == [[1, 3, 32, 32]] * 2 + [[1, 16, 16, 32]] * 8, activations
    assert weights == [[32, 3, 3, 3], [32, 32, 1, 1], [32, 32, 3, 3]], weights
    with tvm_roialign.stock_tvm():
        assert all(_registry.get_op_attr(op, "FRelaxInferLayout") is None for op in layout_qdq.QDQ_OPS)
    assert all(_registry.get_op_attr(op, "FRelaxInferLayout") is not None for op in layout_qdq.QDQ_OPS)


def test_a_kept_conv_stays_as_imported(models):
    """``keep_layer`` (the layers fp32 runs faster) is asked of each conv and matmul the pass would
    take, by its call (a conv's weight still a ``dequantize``, its shape in the call's type), and
    the layer it is true for stays as imported."""
    _, mod, *_ = models["u8"]
    converted = ConvertLayoutWherePossible(desired_layouts("NHWC"))(mod)
    seen = []

    def keep(call):
        kernel = None
        if call.op.name == "relax.nn.conv2d":
            shape, layout = tensor_shape(call.args[1]), str(call.attrs.kernel_layout)
            kernel = tuple(shape[layout.index(a)] for a in "HWIO")
        seen.append((call.op.name, kernel))
        return kernel is not None and kernel[:2] == (3, 3)

    calls = _int8_calls(QDQContractions(keep_layer=keep)(converted))
    assert [name.rstrip("0123456789") for name, *_ in calls] == ["int8_conv2d", "int8_matmul"]
    assert seen == [("relax.nn.conv2d", (1, 1, 32, 32)), ("relax.nn.conv2d", (3, 3, 32, 32)),
                    ("relax.matmul", None)]


def _nhwc_conv_call(weight) -> relax.Call:
    """A 3x3 stride-1 conv over 64 channels at 56 x 56 (NHWC data, OIHW kernel) of ``weight``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 56, 56, 64], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = weight if isinstance(weight, tvm.ir.expr.Constant) else bb.emit(weight)
            y = bb.emit_output(relax.op.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="OIHW"))
        bb.emit_func_output(y)
    return next(b.value for b in bb.get()["main"].body.blocks[0].bindings if b.var.same_as(y))


def test_winograd_convs_stay_as_imported_on_avx2_only():
    """The convs Winograd takes, judged from the types (a QDQ weight is a ``dequantize`` until
    constant folding): left to fp32 Winograd by AVX2's int8 kernels (2x fp32's rate), taken by VNNI's
    (4x); the same geometry as :func:`winograd_plan` gives the conv of the folded constant weight."""
    from tvm_roialign.passes.winograd import winograd_geometry, winograd_plan
    from tvm_roialign.precision.qdq import int8_keeps

    q = np.random.default_rng(0).integers(-64, 65, (64, 64, 3, 3)).astype(np.int8)
    scale = relax.const(np.full(64, 0.01, np.float32))
    dequantized = _nhwc_conv_call(relax.op.dequantize(relax.const(q), scale, relax.const(0, "int8"), axis=0))
    folded = _nhwc_conv_call(relax.const(q.astype(np.float32) * np.float32(0.01)))
    assert int8_keeps("avx2", 4, 320)(dequantized) and int8_keeps("avx2", 4, 320)(folded)
    assert not int8_keeps("avx512vnni", 4, 320)(dequantized)
    assert winograd_plan(dequantized) is None  # no constant weight to transform yet
    _, *plan = winograd_plan(folded)
    assert plan == list(winograd_geometry(dequantized)) == list(winograd_geometry(folded))


@pytest.mark.parametrize("unit", list(INT8_TARGETS))
def test_targets_with_int8_kernels_take_the_qdq_layers(models, unit):
    """Phases 1-3 for each kind of int8 kernel (no run, no warning): three int8 contractions."""
    _, mod, *_ = models["u8"]
    target = parse_target(INT8_TARGETS[unit])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared = prepare_pipeline(target)(mod)
    kernels = [gv for gv, f in prepared.functions_items() if "int8_contraction" in f.script()]
    assert len(kernels) == 3, [gv.name_hint for gv in kernels]
    assert resolve(target, "fp32", mod).metadata() == {
        "precision": "int8", "int8_kernels": unit, "quantization": "qdq"
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_weight_peak_is_the_onnx_weights(models, variant):
    """The largest int8 weight magnitude the pipeline reads off the imported model is the ONNX
    file's: 127 for the 8-bit models, 64 for ``reduce_range``."""
    path, mod, *_ = models[variant]
    model = onnx.load(path)
    values = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    dequantized = [values.get(n.input[0]) for n in model.graph.node if n.op_type == "DequantizeLinear"]
    expected = max(int(np.abs(v.astype(np.int32)).max()) for v in dequantized
                   if v is not None and v.dtype == np.int8)
    assert qdq_weight_peak(mod) == expected == (64 if variant == "u8_reduce_range" else 127)


def test_avx2_kernels_take_a_reduce_range_model(models):
    """On AVX2 (``vpmaddubsw``, exact for weights within +-64) a ``reduce_range`` model's three
    layers run on the int8 kernels, no warning: within :data:`QUANTA` of the float64 graph, of ONNX
    Runtime's evaluation of it and of ONNX Runtime's int8 kernels; 8-bit weights stay fake-quant
    there, with a note naming the limit and ``reduce_range``."""
    path, mod, xs, reference, quantum = models["u8_reduce_range"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared = prepare_pipeline(AVX2_ONLY)(mod)
        built = build(mod, AVX2_ONLY)
    assert sum("int8_contraction" in f.script() for _, f in prepared.functions_items()) == 3
    assert "vpmaddubsw" in built.executable.mod.imports[0].inspect_source("asm")
    actual = _run(built.executable, xs)
    _assert_within_quanta(actual, reference, quantum, "float64")
    _assert_within_quanta(actual, _ort(path, xs, kernels=False), quantum, "onnxruntime (graph)")
    _assert_within_quanta(actual, _ort(path, xs, kernels=True), quantum, "onnxruntime (int8)")
    assert resolve(AVX2_ONLY, "fp32", mod).metadata()["int8_kernels"] == "avx2"
    assert resolve(AVX2_ONLY, "fp32", models["u8"][1]).metadata()["int8_kernels"] is None
    note = qdq_note(AVX2_ONLY, 127)
    assert "reach 127" in note and "up to 64" in note and "reduce_range=True" in note


def test_precision_options_on_a_qdq_model(models):
    """bf16 keeps the model's quantization (a warning says so); a calibration is refused."""
    _, mod, xs, reference, quantum = models["u8"]
    with pytest.warns(UserWarning, match="already quantized"):
        executable = build(mod, AVX2_ONLY, precision="bf16").executable
    _assert_within_quanta(_run(executable, xs[:1]), reference[:1], quantum, "float64")
    with pytest.raises(Exception, match="already quantized"):
        build(mod, AVX2_ONLY, precision="int8", calibration=[[xs[0]]])


@pytest.fixture
def board():
    """A session per test: the board's server process died (SIGSEGV) loading a second int8
    library (sdot after usdot) into one session; each alone passes."""
    session = remote.connect(rpc=board_address())
    require_cross_linker()
    yield session
    remote.close(session)


@pytest.mark.board
@pytest.mark.parametrize(("unit", "variant"), [("usdot", "u8"), ("sdot", "u8"), ("usdot", "s8")])
def test_int8_kernels_on_the_board(models, board, tmp_path, unit, variant):
    """Built for AArch64 with ``usdot`` (I8MM) or ``sdot`` (the dot product alone) and run on the
    board: within :data:`QUANTA` of the float64 graph and of ONNX Runtime's evaluation of it."""
    path, mod, xs, reference, quantum = models[variant]
    target = parse_target(INT8_TARGETS[unit])
    built = build(mod, target)
    assert f"{unit}\t" in built.executable.mod.imports[0].inspect_source("asm")
    device = board.cpu(0)
    library = export_library(built.executable, tmp_path / f"{unit}.so", BOARD_TARGET)
    vm = remote.load_vm(board, library, device)
    actual = [remote.run_vm(vm, [tvm.runtime.tensor(x, device)]).numpy() for x in xs]
    _assert_within_quanta(actual, reference, quantum, "float64")
    _assert_within_quanta(actual, _ort(path, xs, kernels=False), quantum, "onnxruntime (graph)")


def test_cli_compile_and_run_a_qdq_model(models, tmp_path, capsys):
    """``compile x_qdq.onnx`` (8-bit weights) for AVX2 (a note, fake-quant float) and ``run``;
    ``--calibrate`` on it is a one-line error."""
    path, _, xs, reference, quantum = models["u8"]
    out = tmp_path / "m.so"
    code, stdout, err = run_cli(["compile", path, "--target", "llvm -mcpu=haswell", "-o", str(out)], capsys,
                                quiet=False)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "ONNX QDQ" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "up to 64" in notes[0], err
    assert "quantized ONNX QDQ" in stdout
    meta = json.loads((tmp_path / "m.so.json").read_text())
    assert (meta["precision"], meta["int8_kernels"], meta["quantization"]) == ("fp32", None, "qdq")
    np.savez(tmp_path / "in.npz", x=xs[0])
    argv = ["run", str(out), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz")]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    _assert_within_quanta([np.load(tmp_path / "out.npz")["output_0"]], reference[:1], quantum, "float64")
    argv = ["compile", path, "--precision", "int8", "--calibrate", str(tmp_path), "-o", str(out)]
    code, _, err = run_cli(argv, capsys)
    assert code != 0
    one_line_error(err, "--calibrate", "already quantized")
