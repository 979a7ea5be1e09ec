"""``tvm-roialign maskrcnn --precision int8``: the main job with an int8 detector (one calibrated
artifact, tvm_roialign.cli._maskrcnn_int8), judged against PyTorch eager by the int8 criterion
(tvm_roialign.models.compare_bf16.INT8_CRITERIA), on a tiny Mask R-CNN (tests/_tiny_rcnn.py) in
place of the ResNet-50 so that it compiles in a minute; the criterion itself on constructed
detections."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _cli import one_line_error, run_cli
from _tiny_rcnn import tiny_rcnn

from tvm_roialign.models.compare_bf16 import BF16_CRITERIA, INT8_CRITERIA, compare_bf16
from tvm_roialign.schedules.lowp.int8 import int8_instructions
from tvm_roialign.target import parse_target


def _confident_tiny(config):
    """The tiny Mask R-CNN with class 2 made confident (its score bias raised), so that there
    are detections scored >= 0.5 to compare."""
    model = tiny_rcnn(masks=True, seed=0, detections_per_img=20)
    with torch.no_grad():
        model.roi_heads.box_predictor.cls_score.bias[2] += 6.0
    return model


def _detections(n: int, shift: float = 0.0) -> dict:
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 100, (n, 2))
    boxes = np.concatenate([xy, xy + 30], axis=1).astype(np.float32)
    return {"boxes": boxes + np.float32(shift), "labels": np.ones(n, np.int64),
            "scores": np.full(n, 0.9, np.float32)}


def test_int8_criterion_takes_95_percent():
    ref = _detections(40)
    ours = {k: v.copy() for k, v in ref.items()}
    ours["boxes"][:2] += 20.0  # 2 of 40 lost: 95% matched
    assert compare_bf16(ours, ref, precision="int8")["passed"]
    assert not compare_bf16(ours, ref)["passed"]  # bf16's 99%
    ours["boxes"][2] += 20.0  # 3 of 40: 92.5%
    cmp = compare_bf16(ours, ref, precision="int8")
    assert not cmp["passed"] and cmp["mode"] == "int8" and cmp["criteria"] == INT8_CRITERIA
    assert ">= 95%" in INT8_CRITERIA and ">= 99%" in BF16_CRITERIA


NO_INT8 = pytest.mark.skipif(
    int8_instructions(parse_target("native")) is None,
    reason="this CPU has no int8 kernels (maskrcnn --precision int8 builds fp32 there, with a note)",
)


@NO_INT8
def test_maskrcnn_int8_check(cli_workdir, capsys, monkeypatch):
    from tvm_roialign.models import maskrcnn as mr

    monkeypatch.setattr(mr, "build_torch_model", _confident_tiny)
    out = cli_workdir / "int8" / "result.png"
    out.parent.mkdir()
    argv = ["maskrcnn", "--out", str(out), "--precision", "int8", "--min-size", "160", "--repeat", "1"]
    code, stdout, err = run_cli([*argv, "--check"], capsys)
    assert code == 0, err + stdout
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["precision"] == "int8"
    assert report["int8_kernels"] == int8_instructions(parse_target("native"))
    assert report["fp32_layers"] == ["box_predictor", "rpn"] and report["mode"] == "fast"
    cmp = report["comparison"]
    assert cmp["passed"] and cmp["mode"] == "int8" and cmp["confident_torch"] > 0
    assert cmp["matched_torch"] >= 0.95 * cmp["confident_torch"]
    assert set(report["schema"]) >= set(report) - {"schema"}
    assert "PASS" in stdout and out.exists()


@NO_INT8
def test_maskrcnn_int8_errors(cli_workdir, capsys):
    for extra, words in (
        (["--shapes", "static"], ("--shapes static", "any size")),
        (["--calibrate", str(cli_workdir / "missing")], ("--calibrate", "directory")),
        (["--compile-only"], ("--compile-only",)),
    ):
        code, _, err = run_cli(
            ["maskrcnn", "--precision", "int8", "--out", str(cli_workdir / "e.png"), *extra], capsys)
        assert code != 0
        one_line_error(err, *words)
    code, _, err = run_cli(
        ["maskrcnn", "--calibrate", str(cli_workdir), "--out", str(cli_workdir / "e.png")], capsys)
    one_line_error(err, "--calibrate", "int8")


def test_a_failed_int8_check_on_random_weights_says_why(capsys):
    """FAIL on the default random weights comes with the reason and what to give instead; on a
    weights file, or a pass, no such note."""
    from tvm_roialign.cli._maskrcnn_int8 import print_int8_summary

    cmp = {"num_detections_tvm": 100, "num_detections_torch": 100, "score_threshold": 0.5, "box_iou": 0.9,
           "matched_torch": 3, "confident_torch": 100, "matched_tvm": 3, "confident_tvm": 100,
           "mean_mask_iou": 0.5, "max_score_diff": 0.02, "passed": False, "criteria": "int8"}
    report = {"int8_kernels": "avx512vnni", "mode": "fast", "fp32_layers": ["box_predictor"],
              "compile_s": 1.0, "tvm_s": 0.5, "torch_s": 2.0, "comparison": cmp,
              "weights": "random (weights=None, weights_backbone=None, seed 3)"}
    print_int8_summary(report, "out.png", "out.json")
    out = capsys.readouterr().out
    assert "-> FAIL" in out and "note: with random weights" in out and "--weights" in out
    for changed in ({"weights": "trained.pth"}, {"comparison": {**cmp, "passed": True}}):
        print_int8_summary({**report, **changed}, "out.png", "out.json")
        assert "note:" not in capsys.readouterr().out
