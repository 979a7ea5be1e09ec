"""``precision="int8"``: post-training static quantization, u8 x s8 -> s32 on AMX-INT8 (tdpbusd) or
AVX512-VNNI (vpdpbusd); on AArch64 on usdot (I8MM) or sdot (the dot product alone; the assembly
here, the results on the board: tests/test_board.py).

The kernels are held to an int64 NumPy reference exactly: the inputs are integers spanning 255
(so the calibrated activation scale is 1 and the zero point an integer) and the weights integers
with a +-127 in every output channel (so the weight scales are 1): the int32 accumulation, the
zero-point correction and the dequantization are then exact, and the fp32 output equals the int64
product. A small network calibrated on the sample photos is held to eager PyTorch (cosine >= 0.99).
The assembly is checked for the instructions on Sapphire Rapids and Rocket Lake targets (building
needs neither); running needs a CPU with ``amx_int8`` and Linux's permission for the tile state, or
``avx512_vnni`` (skipped with the reason elsewhere).
"""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
import torch
import tvm
from _cli import one_line_error, run_cli
from tvm import relax

from tvm_roialign.frontend import from_exported_program
from tvm_roialign.host import cpu_flags, request_amx
from tvm_roialign.passes.int8_contractions import clipped_range
from tvm_roialign.pipeline import build
from tvm_roialign.precision.calibration import calibration_inputs
from tvm_roialign.schedules.lowp.int8 import int8_instructions, int8_pays
from tvm_roialign.target import parse_target
from tvm_roialign.testing import generic_int8, run_first
from tvm_roialign.topi.int8_contraction import ActivationQuant, quantize_weight

AMX_TARGET = parse_target("llvm -mcpu=sapphirerapids")
#: AVX512-VNNI without AMX
VNNI_TARGET = parse_target("llvm -mcpu=rocketlake")
#: AVX-VNNI (256-bit, VEX) without AVX-512: an Intel client core
AVX_VNNI_TARGET = parse_target("llvm -mcpu=alderlake")
#: AVX2 without VNNI: vpmaddubsw kernels with weights within +-64
AVX2_TARGET = parse_target("llvm -mcpu=haswell")
#: AVX without AVX2: no int8 kernels, int8 falls back to fp32, and the library runs on any x86-64 CPU
#: with AVX (a target with AVX-512, say skylake-avx512, would die of SIGILL on an AMD Zen 3)
NO_INT8 = parse_target("llvm -mcpu=sandybridge")
UNITS = {
    "amx": (AMX_TARGET, "tdpbusd"),
    "vnni": (VNNI_TARGET, "vpdpbusd"),
    "avxvnni": (AVX_VNNI_TARGET, "{vex}\tvpdpbusd\t%ymm"),
    "avx2": (AVX2_TARGET, "vpmaddubsw"),
}
#: the largest weight of each unit's kernels (AVX2's: 64, exact in vpmaddubsw's int16 pairs)
LIMITS = {"avx2": 64}
#: AArch64 with I8MM (usdot), and with the dot product alone (sdot)
AARCH64_UNITS = {
    "usdot": parse_target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod,+i8mm"),
    "sdot": parse_target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod"),
}


def _runnable_or_skip(unit: str) -> None:
    if unit == "avx2":
        if "avx2" not in cpu_flags():
            pytest.skip("this CPU has no AVX2 (avx2 in /proc/cpuinfo)")
    elif unit == "amx":
        if "amx_int8" not in cpu_flags():
            pytest.skip("this CPU has no AMX-INT8 (amx_int8 in /proc/cpuinfo)")
        try:
            request_amx(required=True)
        except RuntimeError as err:
            pytest.skip(str(err))
    elif unit == "avxvnni":
        if "avx_vnni" not in cpu_flags():
            pytest.skip("this CPU has no AVX-VNNI (avx_vnni in /proc/cpuinfo)")
    elif "avx512_vnni" not in cpu_flags():
        pytest.skip("this CPU has no AVX512-VNNI (avx512_vnni in /proc/cpuinfo)")


def _asm(executable) -> str:
    return executable.mod.imports[0].inspect_source("asm")


def _integers(rng, shape, low: int) -> np.ndarray:
    """Integers in ``[low, low + 255]`` with both ends present (an activation scale of 1)."""
    values = rng.integers(low, low + 256, size=shape).astype(np.float32)
    flat = values.reshape(-1)
    flat[0], flat[1] = low, low + 255
    return values


def _weights(rng, shape, axis: int, limit: int = 127) -> np.ndarray:
    """Integer weights in ``[-limit, limit]`` with a +-limit in every slice along ``axis`` (scale 1
    for kernels of that weight range)."""
    w = rng.integers(-limit, limit + 1, size=shape)
    index = [0] * len(shape)
    for channel in range(shape[axis]):
        index[axis] = channel
        w[tuple(index)] = limit if channel % 2 else -limit
    return w.astype(np.float32)


def _matmul_module(k: int, n: int, weight: np.ndarray, m: int) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([m, k], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(x, relax.const(weight)))
        bb.emit_func_output(y)
    return bb.get()


def _conv(x, weight: np.ndarray, stride: int, padding: int = 1):
    return relax.op.nn.conv2d(x, relax.const(weight), strides=stride, padding=padding,
                              data_layout="NHWC", kernel_layout="OHWI")


def _conv_module(shape, weight: np.ndarray, stride: int, padding: int = 1) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(_conv(x, weight, stride, padding))
        bb.emit_func_output(y)
    return bb.get()


def _shared_input_module(shape, w3: np.ndarray, w1: np.ndarray) -> tvm.IRModule:
    """``x`` read by a 3x3 conv, a 1x1 conv and an add: one fp32 input of two int8 contractions and
    of another op."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(_conv(x, w3, 1), _conv(x, w1, 1, padding=0)))
            y = bb.emit_output(relax.op.add(y, relax.op.sum(x, axis=[3], keepdims=True)))
        bb.emit_func_output(y)
    return bb.get()


def _conv_reference(x: np.ndarray, w_ohwi: np.ndarray, stride: int, padding: int = 1) -> np.ndarray:
    """int64 NHWC convolution, zero padding ``padding``."""
    xi, wi = x.astype(np.int64), w_ohwi.astype(np.int64)
    n, h, width, _ = xi.shape
    o, kh, kw, _ = wi.shape
    p = padding
    padded = np.pad(xi, ((0, 0), (p, p), (p, p), (0, 0)))
    oh, ow = (h + 2 * p - kh) // stride + 1, (width + 2 * p - kw) // stride + 1
    out = np.zeros((n, oh, ow, o), np.int64)
    for dy in range(kh):
        for dx in range(kw):
            patch = padded[:, dy:dy + stride * oh:stride, dx:dx + stride * ow:stride, :]
            out += np.einsum("nhwc,oc->nhwo", patch, wi[:, dy, dx, :])
    return out


def _exact_cases(limit: int) -> dict:
    """(module, x, int64 reference) of a matmul and of convs, weights within ``[-limit, limit]``:
    sizes off the kernels' blocks (rows 50, reduction 200, columns 70; a 3x3 stride-2 conv over 32
    channels; a 3x3 stride-1 conv of 520 output pixels; an RGB stem, 7x7 stride 2 over 3 channels,
    its kernel rows' narrow taps; one input read by a 3x3 conv, a 1x1 conv and a sum)."""
    rng = np.random.default_rng(0)
    w = _weights(rng, (200, 70), 1, limit)
    xm = _integers(rng, (50, 200), -100)
    # the largest products: row 1's first quad at the top of the activations' range times a quad
    # of +-limit in every column (AVX2's int16 pairs at 2 * 255 * limit: saturated beyond 64)
    w[1:4], xm[1, :4] = w[0], -100 + 255
    matmul = (_matmul_module(200, 70, w, 50), xm, xm.astype(np.int64) @ w.astype(np.int64))
    wc = _weights(rng, (48, 3, 3, 32), 0, limit)
    xc = _integers(rng, (1, 13, 11, 32), -40)
    conv = (_conv_module(xc.shape, wc, 2), xc, _conv_reference(xc, wc, 2))
    # enough 32-row blocks for the schedule that gathers each block's rows right before use
    xr = _integers(rng, (1, 20, 26, 32), -40)
    rows = (_conv_module(xr.shape, wc, 1), xr, _conv_reference(xr, wc, 1))
    ws = _weights(rng, (40, 7, 7, 3), 0, limit)
    xs = _integers(rng, (1, 37, 29, 3), -60)
    stem = (_conv_module(xs.shape, ws, 2, padding=3), xs, _conv_reference(xs, ws, 2, padding=3))
    w1 = _weights(rng, (48, 1, 1, 32), 0, limit)
    shared = (_shared_input_module(xr.shape, wc, w1), xr,
              _conv_reference(xr, wc, 1) + _conv_reference(xr, w1, 1, padding=0)
              + xr.astype(np.int64).sum(axis=3, keepdims=True))
    return {"matmul": matmul, "conv": conv, "conv_many_rows": rows, "rgb_stem": stem, "shared_input": shared}


@pytest.fixture(scope="module")
def exact_cases():
    """:func:`_exact_cases` of 8-bit weights."""
    return _exact_cases(127)


@pytest.mark.parametrize("unit", ["amx", "vnni", "avxvnni", "avx2"])
@pytest.mark.parametrize("case", ["matmul", "conv", "conv_many_rows", "rgb_stem", "shared_input"])
def test_int8_kernels_match_int64_exactly(exact_cases, unit, case):
    mod, x, reference = (exact_cases if unit not in LIMITS else _exact_cases(LIMITS[unit]))[case]
    target, instruction = UNITS[unit]
    executable = build(mod, target, layout=None, precision="int8", calibration=[[x]]).executable
    assert instruction in _asm(executable)
    _runnable_or_skip(unit)
    actual = run_first(executable, x)
    assert np.abs(reference).max() < 2**24  # exact in fp32
    np.testing.assert_array_equal(actual.astype(np.int64), reference)


@pytest.mark.parametrize("unit", ["usdot", "sdot"])
def test_aarch64_int8_target_assembly(exact_cases, unit):
    """Cross-compiled for AArch64 (calibrated on this machine): the dot product of the target's
    features, and not the other one."""
    from tvm_roialign.precision import resolve

    mod, x, _ = exact_cases["conv"]
    target = AARCH64_UNITS[unit]
    asm = _asm(build(mod, target, layout=None, precision="int8", calibration=[[x]]).executable)
    other = "sdot" if unit == "usdot" else "usdot"
    assert re.search(rf"\b{unit}\t", asm) and not re.search(rf"\b{other}\t", asm)
    assert resolve(target, "int8").metadata()["int8_kernels"] == unit


class _SmallResNet(torch.nn.Module):
    """A 3x3 stem, a stride-2 3x3, a residual 1x1 pair, global pooling, a linear layer."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32))
        self.down = torch.nn.Sequential(
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.BatchNorm2d(64)
        )
        self.a = torch.nn.Sequential(torch.nn.Conv2d(64, 32, 1), torch.nn.BatchNorm2d(32), torch.nn.ReLU())
        self.b = torch.nn.Sequential(torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64))
        self.fc = torch.nn.Linear(64, 20)

    def forward(self, x):
        y = torch.relu(self.down(torch.relu(self.stem(x))))
        y = torch.relu(self.b(self.a(y)) + y)
        return self.fc(y.mean((2, 3)))


@pytest.fixture(scope="module")
def small_resnet():
    """(model, its .pt2-exported Relax module, the astronaut photo 64x64): batch norms from three
    training passes on the sample photos."""
    from tvm_roialign.models.classifier_zoo import calibrate_batch_norms, photo_batch

    torch.manual_seed(0)
    model = _SmallResNet()
    calibrate_batch_norms(model, photo_batch(size=64))
    x = photo_batch(("astronaut",), 64)
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=False)
    return model, mod, x


def test_small_resnet_int8_close_to_eager(small_resnet):
    """Calibrated on the sample photos (the default): cosine >= 0.99 against eager fp32, on this
    CPU's int8 kernels, or where it has none, on TVM's generic schedules of the same int8
    contractions (``generic_int8``: the same integers)."""
    model, mod, x = small_resnet
    native = parse_target("native")
    kind = int8_instructions(native)
    if kind is None:
        with generic_int8():
            executable = build(mod, native, precision="int8").executable
    else:
        executable = build(mod, native, precision="int8").executable
        _runnable_or_skip({"avx512vnni": "vnni"}.get(kind, kind))
    actual = run_first(executable, x.numpy()).ravel().astype(np.float64)
    with torch.no_grad():
        expected = model(x).numpy().ravel().astype(np.float64)
    cosine = actual @ expected / np.linalg.norm(actual) / np.linalg.norm(expected)
    assert cosine >= 0.99, cosine


def test_target_without_int8_units_builds_fp32_with_a_warning(exact_cases):
    mod, x, reference = exact_cases["matmul"]
    with pytest.warns(UserWarning, match="precision int8: .*building fp32"):
        executable = build(mod, NO_INT8, layout=None, precision="int8", calibration=[[x]]).executable
    asm = _asm(executable)
    assert not any(i in asm for i in ("vpdpbusd", "tdpbusd", "vpmaddubsw"))
    np.testing.assert_allclose(run_first(executable, x), reference, rtol=1e-5)


def test_generic_int8_matches_int64_exactly(exact_cases):
    """``generic_int8``: the int8 contractions on a target without int8 kernels (AVX2), compiled
    by TVM's generic schedules, equal the int64 product as the kernels do; the metadata says so."""
    from tvm_roialign.precision import resolve

    for case in ("matmul", "conv"):
        mod, x, reference = exact_cases[case]
        with generic_int8():
            executable = build(mod, NO_INT8, layout=None, precision="int8", calibration=[[x]]).executable
            assert resolve(NO_INT8, "int8").metadata()["int8_kernels"] == "generic"
        assert "int8_" in executable.mod.imports[0].inspect_source("ll")
        np.testing.assert_array_equal(run_first(executable, x).astype(np.int64), reference)


def test_a_short_reduction_stays_fp32_where_int8_does_not_pay():
    """The kernels pad the reduction to 64: over 16 elements that is 4x the products, more than
    AVX2's 2x rate over fp32 (the matmul stays fp32) and within VNNI's 4x (int8); 32 pay on AVX2."""
    from tvm_roialign.pipeline_phases import prepare_pipeline

    assert [int8_pays("avx2", k) for k in (16, 24, 32, 48, 72)] == [False, False, True, True, True]
    assert int8_pays("avx512vnni", 16) and not int8_pays("avx512vnni", 8)
    rng = np.random.default_rng(0)
    x = _integers(rng, (50, 16), -100)
    mod = _matmul_module(16, 70, _weights(rng, (16, 70), 1), 50)
    options = dict(layout=None, winograd=0, precision="int8", calibration=[[x]])
    avx2 = prepare_pipeline(AVX2_TARGET, **options)(mod).script()
    vnni = prepare_pipeline(VNNI_TARGET, **options)(mod).script()
    assert "int8_matmul" not in avx2 and "int8_matmul" in vnni


def test_keep_fp32_takes_a_predicate_of_the_weight(exact_cases):
    """``keep_fp32`` as a predicate of a contraction's ``[K, N]`` weight (as a detector's layers
    by name): the matmul whose weight it picks stays fp32."""
    from tvm_roialign.pipeline_phases import prepare_pipeline

    mod, x, _ = exact_cases["matmul"]
    picked = []

    def keep(matrix):
        picked.append(matrix.shape)
        return True

    options = dict(layout=None, winograd=0, precision="int8", calibration=[[x]])
    with generic_int8():
        kept = prepare_pipeline(NO_INT8, keep_fp32=keep, **options)(mod)
        taken = prepare_pipeline(NO_INT8, keep_fp32=lambda matrix: False, **options)(mod)
    assert picked == [(200, 70)]
    assert "int8_matmul" not in kept.script() and "int8_matmul" in taken.script()


def test_keep_fp32_leaves_a_contraction_in_fp32(exact_cases):
    mod, x, reference = exact_cases["matmul"]
    executable = build(
        mod, VNNI_TARGET, layout=None, precision="int8", calibration=[[x]], keep_fp32=[-1]
    ).executable
    assert "vpdpbusd" not in _asm(executable)
    with pytest.raises(Exception, match="keep_fp32: position 1 is outside the model's 1 contractions"):
        build(mod, VNNI_TARGET, layout=None, precision="int8", calibration=[[x]], keep_fp32=[1])
    _runnable_or_skip("vnni")  # the library is AVX-512 code
    np.testing.assert_allclose(run_first(executable, x), reference, rtol=1e-5)


def test_clipped_range_keeps_an_exact_range_and_clips_an_outlier():
    exact = np.arange(-10, 246, dtype=np.float32)  # 256 integers: scale 1, no error
    assert clipped_range(exact) == (-10.0, 245.0)
    rng = np.random.default_rng(0)
    values = np.concatenate([np.abs(rng.normal(size=1_000_000)), [60.0]]).astype(np.float32)
    low, high = clipped_range(values)
    assert ActivationQuant.from_range(low, high).zero == 0 and high < 30.0


def test_quantization_of_ranges_and_weights():
    act = ActivationQuant.from_range(-1.0, 3.0)
    assert act.scale == pytest.approx(4.0 / 255) and act.zero == 64
    assert act.quantize(np.array([0.0], np.float32))[0] == act.zero  # zero is exact
    assert ActivationQuant.from_range(0.5, 2.0).zero == 0  # the range widened to contain 0
    w = np.array([[1.0, -0.5], [-2.0, 0.25], [0.5, 0.0]])
    q, scale = quantize_weight(w)
    np.testing.assert_allclose(scale, [2.0 / 127, 0.5 / 127], rtol=1e-6)
    assert q[1, 0] == -127 and q[0, 1] == -127
    np.testing.assert_allclose(q * scale, w, atol=scale.max() / 2 + 1e-7)


def test_calibration_photos_need_an_image_input(exact_cases):
    mod, _, _ = exact_cases["matmul"]
    with pytest.raises(ValueError, match=r"calibrate: .*\[N, 3, H, W\]"):
        calibration_inputs(mod)


def test_cli_compile_int8_and_its_errors(small_resnet, tmp_path, capsys):
    model, _, x = small_resnet
    pt2 = tmp_path / "small.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(pt2))
    out = tmp_path / "small_int8.so"
    code, _, err = run_cli(["compile", str(pt2), "--precision", "int8", "-o", str(out)], capsys)
    assert code == 0, err
    meta = json.loads((tmp_path / "small_int8.so.json").read_text())
    assert meta["precision"] in ("int8", "fp32")
    if meta["precision"] == "int8":
        assert meta["int8_kernels"] in ("amx", "avx512vnni", "avxvnni", "avx2")
    missing = str(tmp_path / "none")
    cases = [
        (["compile", str(pt2), "--calibrate", str(tmp_path), "-o", str(out)], ["--calibrate", "int8"]),
        (
            ["compile", str(pt2), "--precision", "int8", "--calibrate", missing, "-o", str(out)],
            ["--calibrate", "directory"],
        ),
        (
            ["compile", str(pt2), "--precision", "int8", "--keep-fp32", "last", "-o", str(out)],
            ["--keep-fp32", "integers"],
        ),
        (["compile", str(pt2), "--keep-fp32", "0", "-o", str(out)], ["--keep-fp32", "int8"]),
        (
            ["compile", "fasterrcnn_mobilenet_v3_large_fpn", "--precision", "int8", "--keep-fp32", "0",
             "-o", str(out)],
            ["--keep-fp32", "--fp32-layers"],
        ),
    ]
    for argv, words in cases:
        code, _, err = run_cli(argv, capsys)
        assert code != 0
        one_line_error(err, *words)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inputs = tmp_path / "in.npz"
        np.savez(inputs, x=x.numpy())
        outputs = tmp_path / "out.npz"
        code, _, err = run_cli(["run", str(out), "--inputs", str(inputs), "--outputs", str(outputs)], capsys)
    assert code == 0, err
    with np.load(outputs) as result, torch.no_grad():
        actual = result["output_0"].ravel().astype(np.float64)
        expected = model(x).numpy().ravel().astype(np.float64)
    assert actual @ expected / np.linalg.norm(actual) / np.linalg.norm(expected) >= 0.99


def test_narrow_taps_and_shared_inputs_are_quantized_once():
    """An RGB stem (7x7 over 3 channels) runs on the int8 kernels from a copy of its input
    quantized once and padded (each kernel row's 21 inputs a run of 32 bytes: 256 products a row
    for 147, within VNNI's 4x); a 3x3 RGB stem stays fp32 (27 products run as 128); an fp32 input
    read by a 3x3 conv, a 1x1 conv and another op is quantized by one call, which both convs read."""
    from tvm_roialign.pipeline_phases import prepare_pipeline

    cases = _exact_cases(127)
    options = dict(layout=None, winograd=0, precision="int8")

    def prepared(case):
        mod, x, _ = case
        return prepare_pipeline(VNNI_TARGET, calibration=[[x]], **options)(mod)

    stem = prepared(cases["rgb_stem"]).script()
    assert "int8_conv2d" in stem and "int8_padded_input" in stem
    rng = np.random.default_rng(1)
    w3, x3 = _weights(rng, (32, 3, 3, 3), 0), _integers(rng, (1, 32, 32, 3), -60)
    assert "int8_conv2d" not in prepared((_conv_module(x3.shape, w3, 2), x3, None)).script()
    shared = prepared(cases["shared_input"])
    calls = [str(c) for c in re.findall(r"R\.call_tir\((\w+),", shared["main"].script())]
    assert sum("int8_quantize" in c for c in calls) == 1, calls
    assert sum("int8_conv2d" in c for c in calls) == 2, calls


def test_an_input_quantized_in_one_block_is_quantized_again_in_another():
    """The quantized copy of an input is shared only within its binding block: a conv reading the
    same input in a later dataflow block (whose vars the first block's do not reach) quantizes it
    there again; the build runs and equals the int64 reference."""
    rng = np.random.default_rng(2)
    w = _weights(rng, (16, 3, 3, 32), 0)
    x = _integers(rng, (1, 9, 11, 32), -40)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(list(x.shape), "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            a = bb.emit_output(_conv(xv, w, 1))
        with bb.dataflow():
            b = bb.emit_output(relax.op.add(_conv(xv, w, 1), a))
        bb.emit_func_output(b)
    mod = bb.get()
    executable = build(mod, VNNI_TARGET, layout=None, precision="int8", calibration=[[x]]).executable
    _runnable_or_skip("vnni")
    np.testing.assert_array_equal(run_first(executable, x).astype(np.int64), 2 * _conv_reference(x, w, 1))


def _branch_module(weight: np.ndarray, shape) -> tvm.IRModule:
    """``main(x, c)``: ``conv(x) + relu(x)`` summed over channels where ``c``, else ``conv(x) -
    ...``; each branch a conv of ``x`` (3x3) of its own, the branches' blocks apart."""
    out = relax.TensorType([shape[0], shape[1], shape[2], weight.shape[0]], "float32")
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    c = relax.Var("c", relax.TensorType([], "bool"))
    t, e, r = (relax.Var(n, out) for n in "ter")
    then = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(t, _conv(x, weight, 1))])], t)
    negated = relax.op.negative(_conv(x, weight, 1))
    other = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(e, negated)])], e)
    body = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(r, relax.If(c, then, other))])], r)
    func = relax.Function([x, c], body, out).with_attr("global_symbol", "main")
    return relax.transform.Normalize()(tvm.IRModule({"main": func}))


def test_convs_in_branches_quantize_their_input_in_their_own_branch():
    """A conv in each branch of an ``If``, both reading the function's input: each branch quantizes
    it in its own scope (a copy made in one branch is not seen by the other); a branch the
    calibration inputs never take stays fp32, with a warning, instead of failing the build (an
    IndexError before). Both branches run: TVM's memory plan had the ``else`` branch carve its
    quantized input out of a storage only the ``then`` branch allocates, a segfault when it ran
    (``passes.DefineBranchStorages``)."""
    rng = np.random.default_rng(3)
    w = _weights(rng, (16, 3, 3, 32), 0)
    x = _integers(rng, (1, 9, 11, 32), -40)
    mod = _branch_module(w, x.shape)
    reference = _conv_reference(x, w, 1)
    both = [[x, np.array(True)], [x, np.array(False)]]
    executable = build(mod, VNNI_TARGET, layout=None, precision="int8", calibration=both).executable
    assert _asm(executable).count("vpdpbusd") > 0
    with pytest.warns(UserWarning, match="1 of 2 contractions never ran on the calibration inputs"):
        one = build(mod, VNNI_TARGET, layout=None, precision="int8", calibration=both[:1]).executable
    _runnable_or_skip("vnni")
    for c, sign in ((True, 1), (False, -1)):
        args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.array(c))]
        for exe in (executable, one):
            actual = relax.VirtualMachine(exe, tvm.cpu())["main"](*args).numpy()
            np.testing.assert_allclose(actual, sign * reference, rtol=1e-5, atol=1e-3)
