"""``precision="bf16"``: constant-weight convolutions and matmuls on AMX tiles (tdpbf16ps) or on
AVX512-BF16 (vdpbf16ps); on AArch64 on bfdot (the assembly here, the results on the board:
tests/test_board.py).

The kernels are held to a float64 reference computed from the same bf16-rounded inputs and weights,
so the bound is about the fp32 accumulation only: ``|y - ref| <= 1e-5 * sum_k |a_k| |w_k|`` per
output (a wrong rounding of an input would cost about 4e-3 of it). The assembly is checked for the
instructions on Sapphire Rapids and Cooper Lake targets (building needs neither); running needs a CPU
with ``amx_bf16`` and Linux's permission for the tile state, or ``avx512_bf16`` (skipped with the
reason elsewhere).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tvm_roialign.frontend import from_exported_program
from tvm_roialign.host import cpu_flags, request_amx
from tvm_roialign.pipeline import build
from tvm_roialign.target import parse_target
from tvm_roialign.testing import run_first

#: bound of the fp32 accumulation, relative to sum_k |a_k w_k| (see module docstring)
BF16_ACCUMULATION_TOL = 1e-5
AMX_TARGET = parse_target("llvm -mcpu=sapphirerapids")
#: AVX512-BF16 without AMX (a Cooper Lake's features on this machine's CPU name)
AVX512_BF16 = parse_target("llvm -mcpu=rocketlake -mattr=+avx512bf16")
#: AVX-512 without bf16
AVX512_ONLY = parse_target("llvm -mcpu=skylake-avx512")
#: AArch64 with bf16 (and the int8 dot products: a Neoverse V1 / N2 class core's features)
AARCH64_BF16 = parse_target("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+bf16,+dotprod,+i8mm")


def _amx_or_skip():
    try:
        request_amx(required=True)
    except RuntimeError as err:
        pytest.skip(str(err))


def _module(model, *args):
    with torch.no_grad():
        return from_exported_program(torch.export.export(model.eval(), args), keep_params_as_input=False)


def _asm(executable) -> str:
    return executable.mod.imports[0].inspect_source("asm")


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float64)


def _check_bound(actual, reference, magnitude):
    excess = np.abs(actual - reference.numpy()) - BF16_ACCUMULATION_TOL * magnitude.numpy()
    assert excess.max() <= 1e-6, float(excess.max())


def _avx512_bf16_or_skip():
    if "avx512_bf16" not in cpu_flags():
        pytest.skip("this CPU has no AVX512-BF16 (avx512_bf16 in /proc/cpuinfo)")


@pytest.mark.parametrize("unit", ["amx", "avx512bf16"])
def test_bf16_matmul_matches_float64(unit):
    """A linear layer on [2, 25, 100] rows (padded to the 32-row, 32-column blocks), on AMX tiles
    and on vdpbf16ps (a target with AVX512-BF16 and no AMX)."""
    if unit == "amx":
        _amx_or_skip()
        target, instruction = parse_target("native"), "tdpbf16ps"
    else:
        _avx512_bf16_or_skip()
        target, instruction = AVX512_BF16, "vdpbf16ps"
    torch.manual_seed(0)
    layer = torch.nn.Linear(100, 70, bias=False)
    x = torch.randn(2, 25, 100)
    executable = build(_module(layer, x), target, precision="bf16").executable
    assert instruction in _asm(executable)
    a, w = _bf16(x), _bf16(layer.weight.detach())
    _check_bound(run_first(executable, x.numpy()), a @ w.T, a.abs() @ w.abs().T)


@pytest.mark.parametrize("kernel, stride, padding", [(3, 2, 1), (1, 1, 0)])
def test_bf16_conv_matches_float64(kernel, stride, padding):
    """A 3x3 stride-2 conv with zero padding (im2col'd rows) and a 1x1 conv, NHWC after the
    pipeline's layout conversion."""
    _amx_or_skip()
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(16, 40, kernel, stride=stride, padding=padding, bias=False)
    x = torch.randn(1, 16, 9, 11)
    executable = build(_module(conv, x), parse_target("native"), precision="bf16").executable
    a, w = _bf16(x), _bf16(conv.weight.detach())
    ops = dict(stride=stride, padding=padding)
    reference = torch.nn.functional.conv2d(a, w, **ops)
    magnitude = torch.nn.functional.conv2d(a.abs(), w.abs(), **ops)
    _check_bound(run_first(executable, x.numpy()), reference, magnitude)


def test_bf16_conv_of_symbolic_size_matches_float64():
    """A 3x3 stride-2 conv exported with a symbolic height and width (an any-size detector's
    kernels): one build, run on sizes whose row counts are not multiples of the 32-row block."""
    _amx_or_skip()
    torch.manual_seed(2)
    conv = torch.nn.Conv2d(16, 40, 3, stride=2, padding=1, bias=False).eval()
    dims = {2: torch.export.Dim("height", min=4, max=64), 3: torch.export.Dim("width", min=4, max=64)}
    with torch.no_grad():
        program = torch.export.export(conv, (torch.randn(1, 16, 8, 8),), dynamic_shapes=(dims,))
    mod = from_exported_program(program, keep_params_as_input=False)
    executable = build(mod, parse_target("native"), precision="bf16").executable
    assert "tdpbf16ps" in _asm(executable)
    w = _bf16(conv.weight.detach())
    for height, width in [(9, 11), (23, 6)]:
        x = torch.randn(1, 16, height, width)
        a = _bf16(x)
        reference = torch.nn.functional.conv2d(a, w, stride=2, padding=1)
        magnitude = torch.nn.functional.conv2d(a.abs(), w.abs(), stride=2, padding=1)
        _check_bound(run_first(executable, x.numpy()), reference, magnitude)


def test_amx_target_assembly_has_tdpbf16ps():
    """Built for a Sapphire Rapids target on any x86 machine: the tile instructions are there."""
    layer = torch.nn.Linear(64, 64, bias=False)
    asm = _asm(build(_module(layer, torch.randn(32, 64)), AMX_TARGET, precision="bf16").executable)
    for instruction in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored"):
        assert instruction in asm, instruction


def test_avx512_bf16_target_assembly_has_vdpbf16ps():
    """Cooper Lake (AVX512-BF16, no AMX): the vector bf16 dot product, no tiles."""
    layer = torch.nn.Linear(64, 64, bias=False)
    target = parse_target("llvm -mcpu=cooperlake")
    asm = _asm(build(_module(layer, torch.randn(32, 64)), target, precision="bf16").executable)
    assert "vdpbf16ps" in asm and "tdpbf16ps" not in asm


def test_aarch64_bf16_target_assembly_has_bfdot():
    """AArch64 with bf16, cross-compiled: the bf16 dot product, and the metadata says so."""
    from tvm_roialign.precision import resolve

    layer = torch.nn.Linear(64, 64, bias=False)
    asm = _asm(build(_module(layer, torch.randn(32, 64)), AARCH64_BF16, precision="bf16").executable)
    assert "bfdot\t" in asm
    assert resolve(AARCH64_BF16, "bf16").metadata()["bf16_kernels"] == "bfdot"


def test_bf16_without_bf16_instructions_builds_fp32_with_a_note():
    layer = torch.nn.Linear(64, 64, bias=False)
    note = "precision bf16: .* has no AMX, AVX512-BF16 or AArch64 bf16; building fp32"
    with pytest.warns(UserWarning, match=note):
        built = build(_module(layer, torch.randn(32, 64)), AVX512_ONLY, precision="bf16")
    assert "dpbf16ps" not in _asm(built.executable)


def test_unknown_precision_is_refused():
    layer = torch.nn.Linear(8, 8)
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, int8, auto, got 'fp16'"):
        build(_module(layer, torch.randn(2, 8)), AMX_TARGET, precision="fp16")


class _Residual(torch.nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.norm(self.conv(x)))


def _small_convnet() -> torch.nn.Module:
    """A resnet-like net: an RGB stem (stays fp32), a stride-2 3x3 conv, a residual 3x3 block, a
    1x1 conv, batch norms (folded), pooling and a linear layer."""

    def conv(cin, cout, kernel, stride=1):
        return [
            torch.nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False),
            torch.nn.BatchNorm2d(cout),
            torch.nn.ReLU(),
        ]

    return torch.nn.Sequential(
        *conv(3, 16, 3), *conv(16, 32, 3, 2), _Residual(32), *conv(32, 64, 1),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10),
    )


def test_convnet_bf16_close_to_fp32_on_a_photo():
    """A small resnet-like net (random weights, batch-norm statistics from three training passes)
    on the astronaut photo at 96x96: the bf16 build's logits against the fp32 build's."""
    from tvm_roialign.runtime.sample_photos import sample_photo

    _amx_or_skip()
    torch.manual_seed(0)
    model = _small_convnet().train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 3, 96, 96))
    photo = torch.tensor(np.asarray(sample_photo("astronaut"))).permute(2, 0, 1)[None].float() / 255
    x = torch.nn.functional.interpolate(photo, size=(96, 96), mode="bilinear")
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    x = ((x - mean) / std).contiguous()
    mod = _module(model, x)
    native = parse_target("native")
    fp32 = run_first(build(mod, native).executable, x.numpy()).ravel().astype(np.float64)
    executable = build(mod, native, precision="bf16").executable
    assert "tdpbf16ps" in _asm(executable)
    bf16 = run_first(executable, x.numpy()).ravel()
    cosine = fp32 @ bf16 / np.linalg.norm(fp32) / np.linalg.norm(bf16)
    assert cosine >= 0.99, cosine


def test_cli_compile_precision_bf16_runs(pt2_model, cli_workdir, capsys):
    """``compile --precision bf16`` of the conv + RoIAlign model: recorded in the metadata, and the
    run (which asks for the AMX tile state) close to PyTorch's fp32 output."""
    from tvm_roialign import cli

    _amx_or_skip()
    model, inputs, expected = pt2_model
    lib = cli_workdir / "tiny_bf16.so"
    assert cli.main(["-q", "compile", str(model), "-o", str(lib), "--precision", "bf16"]) == 0
    meta = json.loads((cli_workdir / "tiny_bf16.so.json").read_text())
    assert (meta["precision"], meta["bf16_kernels"]) == ("bf16", "amx")
    outputs = cli_workdir / "tiny_bf16_out.npz"
    assert cli.main(["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)]) == 0
    capsys.readouterr()
    with np.load(outputs) as result:
        # a 27-term product of bf16-rounded inputs and weights (relative error about 2 x 2^-9)
        np.testing.assert_allclose(result["output_0"], expected, rtol=0, atol=0.02 * np.abs(expected).max())


def test_cli_compile_precision_bf16_without_the_instructions_notes_fp32(pt2_model, cli_workdir, capsys):
    """A target with neither AMX nor AVX512-BF16: a note on stderr, an fp32 library."""
    from tvm_roialign import cli

    lib = cli_workdir / "tiny_bf16_skx.so"
    argv = ["compile", str(pt2_model[0]), "-o", str(lib), "--precision", "bf16"]
    assert cli.main([*argv, "--target", "llvm -mcpu=skylake-avx512"]) == 0
    assert "note: precision bf16: llvm -mcpu=skylake-avx512" in capsys.readouterr().err
    assert json.loads((cli_workdir / "tiny_bf16_skx.so.json").read_text())["precision"] == "fp32"


def test_user_facing_bf16_needs_amx():
    """``compile``/``compile_detector``: bf16 on AMX (and on AArch64 bf16, when asked); fp32 with
    a note saying why elsewhere (the AVX512-BF16 kernels run slower than fp32, docs/precision.md)."""
    from tvm_roialign.precision import resolve

    def chosen_precision(asked, target):
        plan = resolve(target, asked, avx512_bf16=False)
        return plan.precision, (plan.notes[0] if plan.notes else None)

    assert chosen_precision("bf16", AMX_TARGET) == ("bf16", None)
    assert chosen_precision("fp32", AVX512_ONLY) == ("fp32", None)
    precision, note = chosen_precision("bf16", AVX512_BF16)
    assert precision == "fp32" and "has AVX512-BF16 but no AMX, where bf16 runs slower than fp32" in note
    precision, note = chosen_precision("bf16", AVX512_ONLY)
    assert precision == "fp32" and note.endswith("has no AMX, AVX512-BF16 or AArch64 bf16; building fp32")
    assert chosen_precision("bf16", AARCH64_BF16) == ("bf16", None)
    assert chosen_precision("bf16", parse_target("aarch64"))[0] == "fp32"


def test_any_size_detector_bf16_keeps_eager_detections(tmp_path):
    """A small Mask R-CNN (tests/_tiny_rcnn.py) built any-size in bf16: on the coffee photo, its
    detections against torchvision eager fp32's, matched by label at box IoU >= 0.9 both ways
    (eager's top ten scores; random weights give no score near 0.5)."""
    from _tiny_rcnn import tiny_rcnn

    from tvm_roialign.models import detection as det
    from tvm_roialign.models.compare import match_confident
    from tvm_roialign.runtime import Detector

    _amx_or_skip()
    model = tiny_rcnn(masks=True, seed=0, detections_per_img=20)
    artifact = det.compile_detector(model, None, "native", precision="bf16")
    assert (artifact.meta["precision"], artifact.meta["bf16_kernels"]) == ("bf16", "amx")
    assert "tdpbf16ps" in _asm(artifact.executable)
    rgb = det.sample_photo("coffee")
    ref, ours = det.torch_detections(model, rgb), Detector(artifact.export(tmp_path / "bf16.so"))(rgb)
    score = float(np.sort(ref["scores"])[-10])
    result = match_confident(ref, ours, score=score, iou=0.9)
    assert result["ref_confident"] >= 10 and result["ours_confident"] >= 5, result
    assert result["ref_matched"] >= 0.9 * result["ref_confident"], result
    assert result["ours_matched"] >= 0.9 * result["ours_confident"], result
    assert result["mask_iou_mean"] >= 0.9, result


def test_match_confident_counts_same_label_pairs_both_ways():
    """Confident-detection matching on hand-made detections (box IoUs by hand: 95 / 105 for a
    10 x 10 box shifted by 0.5, 81 / 119 shifted by 1 in x and y; mask IoU 3 / 4)."""
    from tvm_roialign.models.compare import box_iou, match_confident

    box = [0.0, 0.0, 10.0, 10.0]
    ref = {"boxes": np.array([box, [20, 20, 30, 30], [50, 50, 60, 60]]), "labels": np.array([1, 2, 3]),
           "scores": np.array([0.9, 0.8, 0.3])}
    # the first matched; the second (IoU 0.68) not; a same-box detection of another label not
    ours = {"boxes": np.array([[0.5, 0, 10.5, 10], [21, 21, 31, 31], [50, 50, 60, 60]]),
            "labels": np.array([1, 2, 4]), "scores": np.array([0.85, 0.7, 0.6])}
    ref["masks"] = np.zeros((3, 1, 2, 2)) + np.array([[0.9, 0.9], [0.9, 0.9]])
    ours["masks"] = np.zeros((3, 1, 2, 2)) + np.array([[0.9, 0.9], [0.9, 0.1]])
    np.testing.assert_allclose(box_iou(ref["boxes"][:1], ours["boxes"][:1]), [[95 / 105]])
    result = match_confident(ref, ours)
    assert (result["ref_confident"], result["ref_matched"]) == (2, 1)
    assert (result["ours_confident"], result["ours_matched"]) == (3, 1)
    assert result["score_diff_max"] == pytest.approx(0.05)
    assert result["mask_iou_min"] == pytest.approx(0.75)
    low = match_confident(ref, ours, score=0.2, iou=0.6)
    assert (low["ref_confident"], low["ref_matched"], low["ours_matched"]) == (3, 2, 2)


_RUN_WITH_TVM_ALONE = """
import sys
import numpy as np
import tvm
from tvm import relax

x = np.load(sys.argv[2])
vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
# the weights the library computes when loaded (its Winograd transforms), passed after the input
weights = list(vm["load_weights"]()) if vm.module.implements_function("load_weights") else []
out = vm["main"](tvm.runtime.tensor(x), *weights)
np.save(sys.argv[3], (out if hasattr(out, "numpy") else out[0]).numpy())
"""


def test_amx_library_runs_through_tvm_alone(tmp_path):
    """A process that loads an AMX library with TVM's own API (as a C++ program would), without the
    package and its request for the AMX tile state: the kernels ask Linux for it themselves, so the
    first tile instruction does not kill the process."""
    import subprocess
    import sys

    _amx_or_skip()
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(40, 64)
    executable = build(_module(layer, x), parse_target("native"), precision="bf16").executable
    assert "tdpbf16ps" in _asm(executable)
    library = tmp_path / "amx.so"
    executable.export_library(str(library))
    np.save(tmp_path / "x.npy", x.numpy())
    files = [str(library), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")]
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_WITH_TVM_ALONE, *files],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    a, w = _bf16(x), _bf16(layer.weight.detach())
    _check_bound(np.load(tmp_path / "y.npy"), a @ w.T, a.abs() @ w.abs().T)


def test_bf16_rgb_stem_matches_float64():
    """A 7x7 stride-2 conv over 3 channels (an RGB stem: each kernel row's 21 inputs padded to one
    tile's depth of 32), against float64 from the same bf16-rounded inputs and weights."""
    _amx_or_skip()
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(3, 40, 7, stride=2, padding=3, bias=False)
    x = torch.randn(1, 3, 37, 30)
    executable = build(_module(conv, x), parse_target("native"), precision="bf16").executable
    assert "tdpbf16ps" in _asm(executable)
    a, w = _bf16(x), _bf16(conv.weight.detach())
    ops = dict(stride=2, padding=3)
    reference = torch.nn.functional.conv2d(a, w, **ops)
    magnitude = torch.nn.functional.conv2d(a.abs(), w.abs(), **ops)
    _check_bound(run_first(executable, x.numpy()), reference, magnitude)


class _BF16Block(torch.nn.Module):
    """A 1x1 conv + ReLU whose output feeds a 3x3 conv and that conv's residual add."""

    def __init__(self):
        super().__init__()
        self.reduce = torch.nn.Conv2d(16, 32, 1)
        self.conv = torch.nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x):
        h = torch.relu(self.reduce(x))
        return torch.relu(self.conv(h) + h)


def test_bf16_activations_between_contractions_match_float64():
    """The 1x1 conv's output is read only by contractions (as input and as residual), so it is
    stored as bf16 rows, read by the 3x3 conv without a rounding pass. Reference in float64: the
    1x1 conv on the bf16-rounded inputs, its ReLU output rounded to bf16, the 3x3 conv, the
    residual add and ReLU. Bound: the fp32 accumulations (1e-5 of sum |a w| per stage), plus one
    bf16 step (2^-8 relative) for each intermediate whose fp32 sum rounds the other way at a tie
    of the float64 one."""
    from tvm_roialign.pipeline_phases import prepare_pipeline

    _amx_or_skip()
    torch.manual_seed(4)
    block = _BF16Block().eval()
    x = torch.randn(1, 16, 13, 11)
    mod = _module(block, x)
    target = parse_target("native")
    with target:
        prepared = prepare_pipeline(target, precision="bf16")(mod)
    assert 'out_ty=R.Tensor((160, 32), dtype="uint16")' in prepared["main"].script(), "not stored as bf16"
    executable = build(mod, target, precision="bf16").executable
    conv2d = torch.nn.functional.conv2d
    w1, w = _bf16(block.reduce.weight.detach()), _bf16(block.conv.weight.detach())
    b1 = block.reduce.bias.detach().double()[:, None, None]
    b2 = block.conv.bias.detach().double()[:, None, None]
    a = _bf16(x)
    h = _bf16(torch.relu(conv2d(a, w1) + b1))
    reference = torch.relu(conv2d(h, w, padding=1) + b2 + h)
    h_mag = conv2d(a.abs(), w1.abs()) + b1.abs()
    magnitude = conv2d(h.abs(), w.abs(), padding=1) + b2.abs() + h.abs()
    slack = 2.0**-8 * (conv2d(h_mag, w.abs(), padding=1) + h_mag)
    excess = np.abs(run_first(executable, x.numpy()) - reference.numpy())
    excess -= BF16_ACCUMULATION_TOL * magnitude.numpy() + slack.numpy()
    assert excess.max() <= 1e-6, float(excess.max())
