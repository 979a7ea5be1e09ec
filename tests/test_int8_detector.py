"""int8 detectors: ``compile_detector(..., precision="int8")`` and ``compile NAME --precision int8``.

A detector artifact for any size is calibrated through its photo function on the sample photos;
its convolutions and matmuls become int8 contractions except the layers kept in fp32 (the box
predictor by default). The reference an int8 detector is held to is the same detector built with
``tvm_roialign.testing.generic_int8`` on this machine: the same calibration and the same int8
contractions compiled by TVM's generic schedules, exact in int32. Where this CPU has int8 kernels
(AMX-INT8, AVX512-VNNI, AVX2) the test below runs them against it; the aarch64 ``usdot`` / ``sdot``
kernels are held to it on the board (tests/test_board.py). The assembly of a Sapphire Rapids build
is checked on any x86 machine.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from _cli import one_line_error, run_cli
from _detections import assert_matches_eager
from _tiny_rcnn import tiny_rcnn

from tvm_roialign.models import detection as det
from tvm_roialign.precision import resolve
from tvm_roialign.precision.layers import precision_options
from tvm_roialign.runtime import Detector
from tvm_roialign.schedules.lowp.int8 import int8_instructions
from tvm_roialign.target import parse_target
from tvm_roialign.testing import generic_int8

#: the photo the int8 detectors are compared on (not among the calibration photos' sizes only)
PHOTO = "coffee"


def tiny_model():
    return tiny_rcnn(masks=True, seed=0, detections_per_img=20)


def generic_int8_detections(model, rgb, tmp_path, like=None) -> dict:
    """The detections of ``model``'s int8 artifact built for this machine's generic CPU under
    ``generic_int8(like)`` (the int8 contractions on TVM's generic schedules, quantized as the
    kernels of ``like`` are): the reference."""
    with generic_int8(like):
        artifact = det.compile_detector(model, None, "llvm", precision="int8", fast=False)
    assert artifact.meta["int8_kernels"] == "generic"
    return Detector(artifact.export(tmp_path / "generic_int8.so"))(rgb)


def test_int8_detector_for_amx_holds_tdpbusd(tmp_path):
    """Built for Sapphire Rapids here (calibrated on this CPU's fp32 build): AMX-INT8 kernels, the
    box predictor and the RPN head in fp32 (int8's default), and the metadata saying so."""
    artifact = det.compile_detector(tiny_model(), None, "llvm -mcpu=sapphirerapids", precision="int8",
                                    fast=False)
    meta = artifact.meta
    assert (meta["precision"], meta["int8_kernels"]) == ("int8", "amx")
    assert meta["fp32_layers"] == ["box_predictor", "rpn"]
    assert "tdpbusd" in artifact.executable.mod.imports[0].inspect_source("asm")


def test_int8_detector_options_keep_layers_and_take_photos():
    model = tiny_model()
    rgb = det.sample_photo(PHOTO)
    plan = resolve(parse_target("llvm -mcpu=cooperlake"), "int8")
    options = precision_options(model, plan, ("box_predictor",), calibration=[rgb])
    weights = {name: p.detach().numpy() for name, p in model.named_parameters() if name.endswith("weight")}
    keep = options["keep_fp32"]
    assert keep(weights["roi_heads.box_predictor.cls_score.weight"].T)
    assert not keep(weights["roi_heads.box_head.fc6.weight"].T)
    (run,) = options["calibration"]
    assert run[0].dtype == np.uint8 and run[0].shape == rgb.shape
    assert precision_options(model, plan, (), None) == {
        "precision": plan, "keep_fp32": None, "calibration": None,
    }


def test_int8_detector_errors():
    model = tiny_model()
    generic = parse_target("llvm")
    with generic_int8():
        with pytest.raises(ValueError, match=r"precision int8: .*any size.*image_sizes"):
            det.compile_detector(model, (200, 200), generic, precision="int8")
        with pytest.raises(ValueError, match="calibration applies to precision int8"):
            det.compile_detector(model, None, generic, precision="fp32", calibration=[])
    from tvm_roialign.models.maskrcnn import TVMMaskRCNN

    with pytest.raises(ValueError, match="precision int8: TVMMaskRCNN's pieces"):
        TVMMaskRCNN(model, "llvm", precision="int8")


def test_int8_detector_cli_errors(tmp_path, capsys):
    out = str(tmp_path / "d.so")
    cases = [
        (["compile", "maskrcnn_resnet50_fpn", "--precision", "int8", "--keep-fp32", "0", "-o", out],
         ["--keep-fp32", "--fp32-layers"]),
        (["compile", "maskrcnn_resnet50_fpn", "--calibrate", str(tmp_path), "-o", out],
         ["--calibrate", "int8"]),
        (["maskrcnn", "--precision", "int8", "--compile-only", "--out", str(tmp_path / "r.png")],
         ["--compile-only", "compile maskrcnn_resnet50_fpn --precision int8"]),
    ]
    for argv, words in cases:
        code, _, err = run_cli(argv, capsys)
        assert code != 0
        one_line_error(err, *words)


def test_int8_detector_on_this_cpu_equals_generic_int8(tmp_path):
    """This CPU's int8 kernels (AMX-INT8, AVX512-VNNI or AVX2) in the whole detector against the
    generic int8 reference quantized alike: the same detections (labels, boxes within 1e-2 px,
    scores within 1e-4, masks)."""
    native = parse_target("native")
    kernels = int8_instructions(native)
    if kernels is None:
        pytest.skip("this CPU has no int8 kernels (AMX-INT8, AVX512-VNNI, AVX2): the board runs usdot / sdot")
    if kernels == "amx":
        from tvm_roialign.host import request_amx

        try:
            request_amx(required=True)
        except RuntimeError as err:
            pytest.skip(str(err))
    model, rgb = tiny_model(), det.sample_photo(PHOTO)
    artifact = det.compile_detector(model, None, native, precision="int8", fast=False)
    assert artifact.meta["int8_kernels"] == kernels
    ours = Detector(artifact.export(tmp_path / "int8.so"))(rgb)
    assert_matches_eager(ours, generic_int8_detections(model, rgb, tmp_path, like=native), min_count=10)
