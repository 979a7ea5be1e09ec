"""On an aarch64 board over TVM RPC (marked ``board``; they skip without one, see ``tests/_board.py``).

RoIAlign and the fused multi-level op, both layouts, every sampling mode (fixed 2, adaptive 0
and -1), built here for ``aarch64-linux-gnu`` into one cross-linked library and run on the board
against torchvision (1e-5); the bf16 (``bfdot``) and int8 (``usdot``, ``sdot``) contraction kernels
against float64 / int64 NumPy, and in an int8 tiny Mask R-CNN against the generic int8 build;
resnet18 through ``compile --target aarch64`` and ``run --rpc``
against eager; ``tune --rpc-tracker`` measuring a tiny model on the board, its records applied by
``compile``. On the emulated board of ``tools/arm_board.sh`` (qemu-user on 2 shared cores) the
module takes a few minutes.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import tvm
from _board import KEY_ENV, PRECISION_TARGET, TARGET, TRACKER_ENV, board_address, require_cross_linker
from _cli import run_cli
from _detections import assert_matches_eager

import tvm_roialign
from tvm_roialign import remote
from tvm_roialign.linking import export_library
from tvm_roialign.pipeline import build
from tvm_roialign.target import parse_target
from tvm_roialign.testing import single_op_module

pytestmark = pytest.mark.board

IMAGE = (64, 80)
SCALES = [1 / 4, 1 / 8]
SAMPLING = (2, 0, -1)
LAYOUTS = ("NCHW", "NHWC")


@pytest.fixture(scope="module")
def board():
    """An RPC session with the board (closed after the module's tests)."""
    address = board_address()
    require_cross_linker()
    session = remote.connect(rpc=address)
    yield session
    remote.close(session)


def _case():
    rng = np.random.default_rng(5)
    features = [rng.standard_normal((2, 4, IMAGE[0] // 4, IMAGE[1] // 4)).astype("float32")]
    features.append(rng.standard_normal((2, 4, IMAGE[0] // 8, IMAGE[1] // 8)).astype("float32"))
    count = 12
    size = rng.uniform(4, 70, count)
    x1, y1 = rng.uniform(-5, IMAGE[1], count), rng.uniform(-5, IMAGE[0], count)
    boxes = np.stack([x1, y1, x1 + size, y1 + size * rng.uniform(0.5, 2, count)], axis=1)
    batch = np.sort(rng.integers(0, 2, count))
    rois = np.concatenate([batch[:, None], boxes], axis=1).astype("float32")
    return features, rois


def _expected(features, rois, sampling: int, multiscale: bool) -> np.ndarray:
    if not multiscale:
        return torchvision.ops.roi_align(
            torch.from_numpy(features[0]), torch.from_numpy(rois), (3, 3), SCALES[0], sampling, aligned=True
        ).numpy()
    pooler = torchvision.ops.MultiScaleRoIAlign(["0", "1"], (3, 3), sampling)
    x = OrderedDict((str(i), torch.from_numpy(f)) for i, f in enumerate(features))
    boxes = [torch.from_numpy(rois[rois[:, 0] == b, 1:]) for b in range(2)]
    return pooler(x, boxes, [IMAGE, IMAGE]).numpy()


def _function(features, rois, sampling: int, multiscale: bool, layout: str):
    shapes = [f.shape if layout == "NCHW" else f.transpose(0, 2, 3, 1).shape for f in features]
    rois_spec = (list(rois.shape), "float32")
    if multiscale:
        inputs = {f"f{i}": (s, "float32") for i, s in enumerate(shapes)}

        def op(*args):
            return tvm_roialign.multiscale_roi_align(
                list(args[:-1]), args[-1], (3, 3), SCALES, sampling_ratio=sampling, aligned=False,
                layout=layout,
            )
    else:
        inputs = {"data": (shapes[0], "float32")}

        def op(data, rois_var):
            return tvm_roialign.roi_align(
                data, rois_var, (3, 3), spatial_scale=SCALES[0], sampling_ratio=sampling, aligned=True,
                layout=layout,
            )

    return single_op_module(op, **inputs, rois=rois_spec)["main"]


@pytest.fixture(scope="module")
def roi_library(board, tmp_path_factory):
    """(remote VM, cases): every case a function of one library built for the board."""
    features, rois = _case()
    funcs, cases = {}, {}
    for multiscale in (False, True):
        for layout in LAYOUTS:
            for sampling in SAMPLING:
                name = f"{'multiscale' if multiscale else 'roi_align'}_{layout}_{sampling}".replace("-", "m")
                funcs[name] = _function(features, rois, sampling, multiscale, layout).with_attr(
                    "global_symbol", name
                )
                cases[name] = (multiscale, layout, sampling)
    executable = tvm.compile(tvm.IRModule(funcs), target=tvm.target.Target(TARGET))
    path = export_library(executable, tmp_path_factory.mktemp("board") / "roi.so", TARGET)
    device = board.cpu(0)
    vm = remote.load_vm(board, path, device)
    return vm, device, features, rois, cases


@pytest.mark.parametrize("multiscale", [False, True], ids=["roi_align", "multiscale"])
def test_roi_align_on_the_board_vs_torchvision(roi_library, multiscale, tol):
    vm, device, features, rois, cases = roi_library
    for name, (is_multiscale, layout, sampling) in cases.items():
        if is_multiscale != multiscale:
            continue
        data = features if multiscale else features[:1]
        if layout == "NHWC":
            data = [np.ascontiguousarray(f.transpose(0, 2, 3, 1)) for f in data]
        args = [tvm.runtime.tensor(a, device) for a in [*data, rois]]
        got = remote.run_vm(vm, args, func=name).numpy()
        if layout == "NHWC":
            got = got.transpose(0, 3, 1, 2)
        want = _expected(features, rois, sampling, multiscale)
        np.testing.assert_allclose(got, want, rtol=0, atol=tol["float32"], err_msg=name)


def _run_built(board, built, path, *arrays) -> np.ndarray:
    """``built`` cross-linked to ``path`` and run on the board: its first output."""
    device = board.cpu(0)
    vm = remote.load_vm(board, export_library(built.executable, path, TARGET), device)
    out = remote.run_vm(vm, [tvm.runtime.tensor(a, device) for a in arrays])
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _asm(built) -> str:
    return built.executable.mod.imports[0].inspect_source("asm")


@pytest.mark.parametrize("case", ["linear", "conv"])
def test_bf16_bfdot_on_the_board_vs_float64(board, tmp_path, case):
    """``precision="bf16"`` on ``bfdot``: a linear layer on [2, 25, 100] rows and a 3x3 stride-2
    conv (padded to the 32 x 32 blocks), held to float64 of the bf16-rounded operands within the
    x86 kernels' accumulation bound (tests/test_bf16.py)."""
    from test_bf16 import BF16_ACCUMULATION_TOL, _bf16, _module

    torch.manual_seed(0)
    if case == "linear":
        layer, x = torch.nn.Linear(100, 70, bias=False), torch.randn(2, 25, 100)
        a, w = _bf16(x), _bf16(layer.weight.detach())
        reference, magnitude = a @ w.T, a.abs() @ w.abs().T
    else:
        layer, x = torch.nn.Conv2d(16, 40, 3, stride=2, padding=1, bias=False), torch.randn(1, 16, 9, 11)
        a, w = _bf16(x), _bf16(layer.weight.detach())
        reference = torch.nn.functional.conv2d(a, w, stride=2, padding=1)
        magnitude = torch.nn.functional.conv2d(a.abs(), w.abs(), stride=2, padding=1)
    built = build(_module(layer, x), parse_target(PRECISION_TARGET), precision="bf16")
    assert "bfdot\t" in _asm(built)
    actual = _run_built(board, built, tmp_path / f"bf16_{case}.so", x.numpy())
    excess = np.abs(actual - reference.numpy()) - BF16_ACCUMULATION_TOL * magnitude.numpy()
    assert excess.max() <= 1e-6, float(excess.max())


@pytest.mark.parametrize("unit", ["usdot", "sdot"])
@pytest.mark.parametrize("case", ["matmul", "conv"])
def test_int8_dot_products_on_the_board_match_int64_exactly(board, tmp_path, unit, case):
    """``precision="int8"`` on ``usdot`` (I8MM) and on ``sdot`` (the dot product alone, activations
    shifted by 128): integer operands whose quantization is exact (tests/test_int8.py), so the
    board's output equals the int64 product: a matmul of 50 x 200 by 200 x 70 and a 3x3 stride-2
    conv over 32 channels."""
    from test_int8 import _conv_module, _conv_reference, _integers, _matmul_module, _weights

    rng = np.random.default_rng(0)
    if case == "matmul":
        w = _weights(rng, (200, 70), axis=1)
        x = _integers(rng, (50, 200), -100)
        mod, reference = _matmul_module(200, 70, w, 50), x.astype(np.int64) @ w.astype(np.int64)
    else:
        w = _weights(rng, (48, 3, 3, 32), axis=0)
        x = _integers(rng, (1, 13, 11, 32), -40)
        mod, reference = _conv_module(x.shape, w, 2), _conv_reference(x, w, 2)
    mattr = ["+neon", "+dotprod", "+i8mm"] if unit == "usdot" else ["+neon", "+dotprod"]
    built = build(mod, parse_target({**TARGET, "mattr": mattr}), layout=None, precision="int8",
                  calibration=[[x]])
    assert f"{unit}\t" in _asm(built)
    actual = _run_built(board, built, tmp_path / f"int8_{unit}_{case}.so", x)
    np.testing.assert_array_equal(actual.astype(np.int64), reference)


@pytest.mark.parametrize("unit", ["usdot", "sdot"])
def test_int8_detector_on_the_board_equals_generic_int8(board, tmp_path, unit):
    """A tiny Mask R-CNN (tests/_tiny_rcnn.py) as an int8 artifact for any size, built for the
    board (``usdot`` with I8MM, ``sdot`` without), against the same int8 detector on TVM's generic
    schedules here (tests/test_int8_detector.py): the same detections."""
    from test_int8_detector import PHOTO, generic_int8_detections, tiny_model

    from tvm_roialign.models import detection as det
    from tvm_roialign.runtime import Detector

    mattr = ["+neon", "+dotprod", "+i8mm"] if unit == "usdot" else ["+neon", "+dotprod"]
    model, rgb = tiny_model(), det.sample_photo(PHOTO)
    artifact = det.compile_detector(model, None, {**TARGET, "mattr": mattr}, precision="int8", fast=False)
    assert artifact.meta["int8_kernels"] == unit
    ours = Detector(artifact.export(tmp_path / f"int8_{unit}.so"), session=board)(rgb)
    assert_matches_eager(ours, generic_int8_detections(model, rgb, tmp_path), min_count=10)


def test_resnet18_on_the_board_vs_eager(board, tmp_path, capsys):
    """``compile resnet18.pt2 --target aarch64 -o r18.so`` then ``run r18.so --rpc``."""
    address = board_address()
    remote.close(board)  # the server takes one session at a time: the CLI opens its own
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    torch.export.save(torch.export.export(model, (x,)), str(tmp_path / "r18.pt2"))
    np.savez(tmp_path / "in.npz", x=x.numpy())
    lib = tmp_path / "r18.so"
    argv = ["compile", str(tmp_path / "r18.pt2"), "--target", "aarch64", "-o", str(lib)]
    code, _, err = run_cli(argv, capsys, quiet=False)
    assert code == 0 and "cross-linked r18.so" in err, err
    argv = ["run", str(lib), "--rpc", address, "--inputs", str(tmp_path / "in.npz")]
    code, out, err = run_cli([*argv, "--outputs", str(tmp_path / "out.npz"), "--print-time"], capsys,
                             quiet=False)
    assert code == 0, err
    assert "remote cpu" in out and "Execution time summary" in out
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["output_0"], want, rtol=1e-4, atol=1e-4)


def test_tune_through_the_board_tracker(tmp_path, capsys):
    """``tune --rpc-tracker`` with the board measuring a tiny model; ``compile`` applies what beat
    the default rules (and says so)."""
    tracker, key = board_address(TRACKER_ENV), os.environ.get(KEY_ENV, "arm-board")
    require_cross_linker()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 8)).eval()
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 4, 4),)), str(tmp_path / "t.pt2"))
    db = tmp_path / "db"
    target = "llvm -mtriple=aarch64-linux-gnu -num-cores=1"
    argv = ["tune", str(tmp_path / "t.pt2"), "-o", str(db), "--trials", "1", "--target", target]
    code, out, err = run_cli([*argv, "--rpc-tracker", tracker, "--rpc-key", key, "--ops", "matmul"],
                             capsys, quiet=False)
    assert code == 0, err
    assert "beat the default rules' schedule" in out
    baselines = json.loads((db / "tvm_roialign_baselines.json").read_text())["tasks"]
    assert baselines and all(b["default_s"] > 0 for b in baselines.values())  # measured on the board
    lib = tmp_path / "t.so"
    argv = ["compile", str(tmp_path / "t.pt2"), "--target", target, "-o", str(lib)]
    code, out, err = run_cli([*argv, "--tuning-records", str(db)], capsys, quiet=False)
    assert code == 0, err
    assert "tuning records for 1 of 1 matmul tasks: " in out


def test_tiny_faster_rcnn_standalone_on_the_board(tmp_path, capsys):
    """A torchvision-style Faster R-CNN (tests/_tiny_rcnn.py) as one artifact built for aarch64:
    ``run --image --rpc`` runs it on the board (the runner's NumPy steps here); its detections
    equal torchvision eager's (labels, boxes within 1e-2 px, scores within 1e-4)."""
    from _tiny_rcnn import tiny_rcnn

    from tvm_roialign.frontend.detection import export_detector
    from tvm_roialign.models import detection as det

    address = board_address()
    require_cross_linker()
    model = tiny_rcnn(masks=False, seed=0, detections_per_img=20)
    rgb = det.sample_photo("coffee")
    ref = det.torch_detections(model, rgb)
    (padded,) = det.bucket_sizes(model.transform, rgb.shape[:2])  # the photo resized and padded
    program, _ = export_detector(model, padded)
    torch.export.save(program, tmp_path / "tiny.pt2")
    library = tmp_path / "tiny_arm.so"
    argv = ["compile", str(tmp_path / "tiny.pt2"), "--target", "aarch64", "--exact", "-o", str(library)]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    from PIL import Image

    Image.fromarray(rgb).save(tmp_path / "coffee.png")
    out = tmp_path / "result.png"
    argv = ["run", str(library), "--image", str(tmp_path / "coffee.png"), "--out", str(out)]
    code, _, err = run_cli([*argv, "--rpc", address], capsys)
    assert code == 0, err
    report = json.loads(out.with_suffix(".json").read_text())
    ours = {
        "boxes": np.array([d["box"] for d in report["detections"]], np.float32).reshape(-1, 4),
        "labels": np.array([d["label"] for d in report["detections"]], np.int64),
        "scores": np.array([d["score"] for d in report["detections"]], np.float32),
    }
    result = det.compare(ours, ref)
    assert result["passed"], result
    assert_matches_eager(ours, ref)
    assert result["num_detections_tvm"] == len(ref["boxes"]) == 20
