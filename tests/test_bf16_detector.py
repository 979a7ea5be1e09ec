"""bf16 detectors: the bf16 criterion (``models.compare_bf16``), the layers kept in fp32
(``precision.layers``), ``precision="auto"`` per target, and the CLI's one-line errors
for ``--precision`` / ``--fp32-layers``."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_roialign import cli
from tvm_roialign.models.compare_bf16 import BF16_CRITERIA, bf16_passed, compare_bf16
from tvm_roialign.precision import auto_precision, resolve
from tvm_roialign.target import parse_target


def _dets(boxes, labels, scores, masks=None) -> dict:
    out = {"boxes": np.array(boxes, float), "labels": np.array(labels), "scores": np.array(scores, float)}
    if masks is not None:
        out["masks"] = np.array(masks, float)
    return out


#: the fp32 side: two confident detections (10 x 10 boxes) and one below 0.5
_REF = _dets([[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]], [1, 2, 1], [0.9, 0.6, 0.3])


def test_bf16_criterion_passes_boxes_within_iou():
    """IoUs by hand: [0, 0, 10, 9.5] against [0, 0, 10, 10] is 95 / 100; [20, 20, 30, 31] against
    [20, 20, 30, 30] is 100 / 110 = 0.909: both >= 0.9, so both confident detections match."""
    ours = _dets([[0, 0, 10, 9.5], [20, 20, 30, 31], [70, 70, 80, 80]], [1, 2, 3], [0.88, 0.62, 0.2])
    result = compare_bf16(ours, _REF)
    assert (result["confident_torch"], result["matched_torch"]) == (2, 2)
    assert (result["confident_tvm"], result["matched_tvm"]) == (2, 2)
    assert result["max_score_diff"] == pytest.approx(0.02)
    assert result["passed"] and result["mode"] == "bf16" and result["criteria"] == BF16_CRITERIA


@pytest.mark.parametrize(
    "change, why",
    [
        ({"boxes": [[0, 0, 10, 9.5], [20, 20, 30, 32]]}, "IoU 100 / 120 = 0.833 < 0.9"),
        ({"labels": [1, 3]}, "same box, another label"),
        ({"scores": [0.82, 0.62]}, "score difference 0.08 > 0.05"),
    ],
)
def test_bf16_criterion_fails(change, why):
    ours = {"boxes": [[0, 0, 10, 9.5], [20, 20, 30, 31]], "labels": [1, 2], "scores": [0.88, 0.62]}
    ours.update(change)
    result = compare_bf16(_dets(**ours), _REF)
    assert not result["passed"], why


def test_bf16_criterion_counts_both_directions():
    """A confident bf16 detection with no fp32 partner fails it, though fp32's are all matched."""
    ours = _dets([[0, 0, 10, 10], [20, 20, 30, 30], [80, 80, 90, 90]], [1, 2, 1], [0.9, 0.6, 0.7])
    result = compare_bf16(ours, _REF)
    assert (result["matched_torch"], result["confident_tvm"], result["matched_tvm"]) == (2, 3, 2)
    assert not result["passed"]


def test_bf16_criterion_bounds_the_mean_mask_iou():
    """Masks 2 x 2 at 0.5: the first pair's IoU 3 / 4, the second's 1 / 4: mean 0.5 < 0.8."""
    full = [[0.9, 0.9], [0.9, 0.9]]
    ref = dict(_REF, masks=[full, full, full])
    three, one = [[0.9, 0.9], [0.9, 0.1]], [[0.9, 0.1], [0.1, 0.1]]
    ours = _dets([[0, 0, 10, 10], [20, 20, 30, 30]], [1, 2], [0.9, 0.6], [three, one])
    result = compare_bf16(ours, ref)
    assert result["min_mask_iou"] == pytest.approx(0.25)
    assert result["mean_mask_iou"] == pytest.approx(0.5)
    assert not result["passed"]
    ours["masks"] = np.array([three, full])
    assert compare_bf16(ours, ref)["passed"]  # mean (0.75 + 1) / 2


def test_bf16_passed_needs_a_confident_detection():
    empty = {"ref_confident": 0, "ref_matched": 0, "ours_confident": 0, "ours_matched": 0}
    assert not bf16_passed(empty)


@pytest.mark.parametrize(
    "target, expected",
    [
        ("llvm -mcpu=sapphirerapids", "bf16"),
        ("llvm -mcpu=cooperlake", "fp32"),
        ("llvm -mcpu=haswell", "fp32"),
        ("aarch64", "fp32"),
        ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+bf16", "fp32"),
    ],
)
def test_auto_precision_per_target(target, expected):
    """auto: bf16 only where the target has AMX bf16 (AVX512-BF16 alone runs slower than fp32;
    AArch64 bf16 was checked on an emulated board only, its speed not measured)."""
    parsed = parse_target(target)
    assert auto_precision(parsed)[0] == expected
    plan = resolve(parsed, "auto", avx512_bf16=False)
    assert plan.precision == expected and plan.summary.startswith(f"precision auto: {expected} (")


def test_resolve_refuses_unknown_values():
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, int8, auto"):
        resolve(parse_target("llvm -mcpu=sapphirerapids"), "fp16")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--precision", "fp16"], "--precision must be one of fp32, bf16, int8, auto, got 'fp16'"),
        (["--precision", "bf16", "--fp32-layers", "rpn,heads"], "--fp32-layers must be 'none' or"),
    ],
)
@pytest.mark.parametrize("command", ["compile", "maskrcnn"])
def test_cli_precision_errors_are_one_line(command, argv, message, tmp_path, capsys):
    args = [command, "maskrcnn_resnet50_fpn", "-o", str(tmp_path / "m.so")] if command == "compile" else [
        command, "--out", str(tmp_path / "m.png")
    ]
    assert cli.main([*args, *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_fp32_layers_parse():
    from tvm_roialign.precision.layers import DEFAULT_FP32_LAYERS, parse_fp32_layers

    assert parse_fp32_layers(None) == DEFAULT_FP32_LAYERS["bf16"] == ("box_predictor",)
    assert parse_fp32_layers(None, precision="int8") == ("box_predictor", "rpn")
    assert parse_fp32_layers("none") == ()
    assert parse_fp32_layers("rpn, box_predictor,rpn") == ("rpn", "box_predictor")
    with pytest.raises(ValueError, match="fp32_layers must be 'none' or a comma-separated list"):
        parse_fp32_layers(["box_head", "roi_heads"])


def _bf16_calls(mod) -> int:
    text = mod.script()
    return text.count("call_tir(cls.bf16_")


def test_fp32_layers_are_found_in_the_imported_graph():
    """The tiny Mask R-CNN's graph (NHWC) through the bf16 pass: the layers named stay fp32, by
    torchvision module (the box predictor's two linears, the RPN head's three convs)."""
    from _tiny_rcnn import tiny_rcnn

    from tvm_roialign.models.detection import import_detector
    from tvm_roialign.passes import BF16Contractions
    from tvm_roialign.precision.layers import FP32_LAYERS, keeps_fp32

    model = tiny_rcnn(masks=True, seed=0, detections_per_img=20)
    mod, _ = import_detector(model, None)
    count = {
        name: _bf16_calls(BF16Contractions(keep_fp32=keeps_fp32(model, layers))(mod))
        for name, layers in (
            ("none", ()),
            ("box_predictor", ("box_predictor",)),
            ("rpn", ("rpn",)),
            ("all", tuple(FP32_LAYERS)),
        )
    }
    # none kept: backbone convs 2 and 3 (the RGB stem stays fp32), RPN 3, fc6 and fc7, the
    # predictor's 2, the mask head's 2 and its predictor's 2 (the transposed conv as a 1x1 conv)
    assert count["none"] >= 10, count
    assert count["box_predictor"] == count["none"] - 2, count
    assert count["rpn"] == count["none"] - 3, count
    assert count["all"] == 0, count


def test_cli_fp32_layers_with_a_model_file_is_one_line(pt2_model, cli_workdir, capsys):
    """``--fp32-layers`` names detector modules: with a model file, a one-line error."""
    model = pt2_model[0]
    argv = ["compile", str(model), "-o", str(cli_workdir / "f.so"), "--precision", "bf16"]
    assert cli.main([*argv, "--fp32-layers", "rpn"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fp32-layers only applies to a detector name" in err, err


def test_tiny_detector_bf16_with_every_layer_kept_fp32_equals_eager(tmp_path):
    """A bf16 build of the small Mask R-CNN with every layer named in ``fp32_layers``: no
    contraction is left in bf16, so its detections equal torchvision eager's (the exact criteria);
    the metadata records the list."""
    from _tiny_rcnn import tiny_rcnn

    from tvm_roialign.host import request_amx
    from tvm_roialign.models import detection as det
    from tvm_roialign.precision.layers import FP32_LAYERS
    from tvm_roialign.runtime import Detector

    try:
        request_amx(required=True)
    except RuntimeError as err:
        pytest.skip(str(err))
    model = tiny_rcnn(masks=True, seed=0, detections_per_img=20)
    artifact = det.compile_detector(
        model, None, "native", precision="bf16", fp32_layers=list(FP32_LAYERS), fast=False
    )
    assert artifact.meta["precision"] == "bf16" and artifact.meta["fp32_layers"] == list(FP32_LAYERS)
    rgb = det.sample_photo("coffee")
    ours = Detector(artifact.export(tmp_path / "kept.so"))(rgb)
    result = det.compare(ours, det.torch_detections(model, rgb))
    assert result["passed"], result
