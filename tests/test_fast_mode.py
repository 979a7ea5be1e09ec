"""The detectors' fast mode (the default; ``compile_detector(..., fast=True)``, ``--fast``): Winograd
3x3 convolutions, judged against torchvision eager by :data:`tvm_roialign.models.compare.FAST_CRITERIA`.

* the fast criterion itself on hand-made detections (what it lets through, what it catches);
* a default (fast) build of a small 64-channel Mask R-CNN (its backbone, RPN head and mask head have the
  stride-1 3x3 convolutions the rewrite takes) on three photo sizes: exactly that criterion
  against eager, the mode in its metadata and in what ``run`` writes;
* the default, ``--fast`` and ``--exact`` reaching the builds of ``compile DETECTOR``, ``maskrcnn``
  and ``tune maskrcnn``, and both flags refused for a model file that is no detector.

The exact mode (``fast=False``, ``--exact``) is what the other detector tests build, against eager
by :data:`tvm_roialign.models.compare.CRITERIA`.

The Winograd convolution against float64: tests/test_pipeline.py
(``test_winograd_rewrite_structure_and_accuracy``) and tests/test_symbolic_shapes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from _cli import run_cli
from _tiny_rcnn import wide_tiny_mask_rcnn

from tvm_roialign.models import compare as cmp
from tvm_roialign.models import detection as det
from tvm_roialign.runtime import Detector, detect_to_files

T = cmp.FAST_SCORE_THRESHOLD
#: one xdist worker runs this module (`--dist loadgroup`), so the fast build is compiled once
pytestmark = pytest.mark.xdist_group("fast_mode")


def _detections(scores, boxes, labels, masks=None, keypoints=None) -> dict:
    out = {
        "scores": np.asarray(scores, np.float32),
        "boxes": np.asarray(boxes, np.float32).reshape(-1, 4),
        "labels": np.asarray(labels, np.int64),
    }
    if masks is not None:
        out["masks"] = np.asarray(masks, np.float32)
    if keypoints is not None:
        out["keypoints"] = np.asarray(keypoints, np.float32)
    return out


def _reference() -> dict:
    """Three detections: two scored above the threshold, one below it."""
    masks = np.zeros((3, 40, 40), np.float32)
    masks[0, 5:20, 5:20] = 0.9
    masks[1, 20:35, 10:30] = 0.8
    keypoints = np.zeros((3, 2, 3), np.float32)
    keypoints[..., :2] = [[[10, 10], [12, 14]], [[25, 20], [30, 22]], [[1, 1], [2, 2]]]
    return _detections(
        [T + 0.5, T + 0.1, T - 0.1],
        [[5, 5, 20, 20], [10, 20, 30, 35], [0, 0, 8, 8]],
        [1, 2, 3],
        masks,
        keypoints,
    )


def _changed(ref: dict, **changes) -> dict:
    return {**{k: v.copy() for k, v in ref.items()}, **changes}


def test_fast_criterion_on_hand_made_detections():
    ref = _reference()
    same = cmp.compare_fast(ref, ref)
    assert same["passed"] and same["checked_torch"] == same["checked_tvm"] == 2, same
    assert same["min_box_iou"] == 1.0 and same["min_mask_iou"] == 1.0
    # below the threshold, a detection may be missing or moved, and order does not matter
    without_low = {k: v[[1, 0]] for k, v in ref.items()}
    assert cmp.compare_fast(without_low, ref)["passed"]
    # a detection above the threshold missing: on either side
    missing = cmp.compare_fast({k: v[[0, 2]] for k, v in ref.items()}, ref)
    assert not missing["passed"] and missing["unmatched_torch"] == 1, missing
    extra = cmp.compare_fast(ref, {k: v[[0, 2]] for k, v in ref.items()})
    assert not extra["passed"] and extra["unmatched_tvm"] == 1, extra
    # moved by 0.5 px: IoU 0.97 < 0.99; another label; a score off by more than the tolerance
    moved = _changed(ref, boxes=ref["boxes"] + np.array([[0.5, 0, 0.5, 0], [0] * 4, [0] * 4], np.float32))
    assert cmp.compare_fast(moved, ref)["unmatched_torch"] == 1
    relabelled = _changed(ref, labels=np.array([1, 4, 3]))
    assert cmp.compare_fast(relabelled, ref)["unmatched_torch"] == 1
    rescored = _changed(ref, scores=ref["scores"] + np.float32(2 * cmp.FAST_SCORE_TOL))
    assert not cmp.compare_fast(rescored, ref)["passed"]
    # a mask gone; a mask 40% gone (IoU 0.6, but 4% of the masks' pixels differ); a keypoint moved
    masks = ref["masks"].copy()
    masks[1] = 0.0
    gone = cmp.compare_fast(_changed(ref, masks=masks), ref)
    assert not gone["passed"] and gone["min_mask_iou"] == 0.0, gone
    masks = ref["masks"].copy()
    masks[1, 20:26] = 0.0
    cut = cmp.compare_fast(_changed(ref, masks=masks), ref)
    assert cut["min_mask_iou"] == pytest.approx(0.6) and not cut["passed"], cut
    assert cut["mask_pixel_agreement"] == pytest.approx(1 - 120 / 3200), cut
    keypoints = ref["keypoints"].copy()
    keypoints[0, 1, 0] += cmp.FAST_KEYPOINT_TOL + 1
    shifted = cmp.compare_fast(_changed(ref, keypoints=keypoints), ref)
    assert not shifted["passed"], shifted
    assert shifted["max_keypoint_diff"] == pytest.approx(cmp.FAST_KEYPOINT_TOL + 1), shifted
    # nothing scored above the threshold: nothing compared, no pass
    low = {k: v[[2]] for k, v in ref.items()}
    assert not cmp.compare_fast(low, low)["passed"]


def test_fast_criterion_excuses_near_ties_only():
    """A box whose IoU with a better one of its label is a hair under NMS's 0.5 is kept on one
    side and suppressed on the other: a near tie, excused; in a full list (here 2 detections)
    it pushes the lowest out of the other side's list, excused too. The same box at IoU 0.33 is
    a real difference."""
    a, b = [0, 0, 10, 10], [50, 50, 60, 60]
    ref = _detections([0.9, 0.5], [a, b], [1, 1])

    def ours(x):
        return _detections([0.9, 0.6], [a, [x, 0, x + 10, 10]], [1, 1])

    iou = cmp.box_iou(np.array([a], np.float32), ours(3.334)["boxes"][1:])[0, 0]
    assert iou == pytest.approx(0.4999, abs=1e-4)
    tie = cmp.compare_fast(ours(3.334), ref, max_detections=2)
    assert tie["passed"] and tie["near_ties_tvm"] == 1 and tie["near_ties_torch"] == 1, tie
    assert cmp.nms_near_ties(ours(3.334), 0.5) == {1}
    assert not cmp.compare_fast(ours(3.334), ref, max_detections=None)["passed"]  # b: no cut
    real = cmp.compare_fast(ours(5.0), ref, max_detections=2)
    assert not real["passed"] and real["unmatched_tvm"] == 1 and real["unmatched_torch"] == 0, real


def test_compare_for_mode():
    ref = _reference()
    exact = cmp.compare_for_mode(ref, ref, "exact")
    assert exact["passed"] and exact["criteria"] == cmp.CRITERIA and "same_labels" in exact
    fast = cmp.compare_for_mode(ref, ref, "fast")
    assert fast["passed"] and fast["criteria"] == cmp.FAST_CRITERIA and "min_box_iou" in fast
    with pytest.raises(ValueError, match="mode must be 'exact' or 'fast'"):
        cmp.compare_for_mode(ref, ref, "quick")


def test_box_iou_against_hand_computed_values():
    boxes = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 20, 30]], np.float32)
    np.testing.assert_allclose(
        cmp.box_iou(boxes, boxes),
        [[1, 50 / 150, 0], [50 / 150, 1, 0], [0, 0, 0]],
        rtol=1e-12,
    )


def test_graph_options_of_the_modes():
    model = wide_tiny_mask_rcnn(seed=4, detections_per_img=20, logit_scale=300.0)
    assert det.DEFAULT_FAST is True
    assert det.graph_options(model)["winograd"] == (4, 5)
    assert det.graph_options(model, fast=False)["winograd"] == 0
    assert det.graph_options(model)["reference_side"] == det.graph_options(model, False)["reference_side"]


@pytest.fixture(scope="session")
def fast_detector(tmp_path_factory):
    """(model, Detector) of the 64-channel Mask R-CNN built with the defaults (the fast mode) for
    any photo size."""
    model = wide_tiny_mask_rcnn(seed=4, detections_per_img=20, logit_scale=300.0)
    library = tmp_path_factory.mktemp("fast") / "wide_fast.so"
    artifact = det.compile_detector(model, None)
    assert artifact.meta["mode"] == "fast"
    artifact.export(library)
    return model, Detector(library)


def _photos() -> dict:
    coffee = det.sample_photo("coffee")
    return {
        "astronaut": det.sample_photo("astronaut"),
        "coffee": coffee,
        "portrait": np.ascontiguousarray(np.rot90(coffee)),
    }


@pytest.mark.parametrize("photo_name", ["astronaut", "coffee", "portrait"])
def test_fast_build_meets_the_fast_criterion(fast_detector, photo_name):
    """Winograd kernels in the library, and eager's detections by FAST_CRITERIA (at least one
    scored above the threshold)."""
    model, detector = fast_detector
    assert b"winograd_input_transform" in detector.path.read_bytes()
    rgb = _photos()[photo_name]
    result = cmp.compare_fast(detector(rgb), det.torch_detections(model, rgb), **cmp.model_limits(model))
    assert result["passed"], result
    assert result["checked_torch"] >= 5, result


def test_fast_mode_in_the_metadata_and_run_summary(fast_detector, tmp_path):
    _model, detector = fast_detector
    assert detector.mode == "fast"
    summary = detect_to_files(detector, "astronaut", rgb=_photos()["astronaut"])
    assert summary["mode"] == "fast"


def test_fast_flag_reaches_the_builds(monkeypatch, cli_workdir, capsys):
    """``compile NAME`` builds with ``fast=True`` without a flag and with ``--fast``, ``fast=False``
    with ``--exact``; ``maskrcnn`` runs the job likewise (both stopped before the build); ``tune
    maskrcnn`` takes either flag; both at once are a usage error."""
    from tvm_roialign import bench, cli
    from tvm_roialign.cli import CLIError

    seen = []

    def stop_compile(*args, **kwargs):
        seen.append(kwargs.get("fast"))
        raise ValueError("stopped before the build")

    monkeypatch.setattr(det, "compile_detector", stop_compile)
    out = str(cli_workdir / "never_fast.so")
    for extra in ([], ["--fast"], ["--exact"]):
        argv = ["compile", "fasterrcnn_mobilenet_v3_large_fpn", *extra, "-o", out]
        code, _, err = run_cli(argv, capsys)
        assert code == 1 and "stopped before the build" in err, err
    assert seen == [True, True, False]

    def stop_job(model, image, job, progress):
        seen.append(job.fast)
        raise CLIError("stopped before the build")

    monkeypatch.setattr(bench, "run_maskrcnn_report", stop_job)
    for extra, fast in (([], True), (["--fast"], True), (["--exact"], False)):
        out_png = str(cli_workdir / "f.png")
        argv = ["maskrcnn", *extra, "--min-size", "64", "--no-onnxruntime", "--out", out_png]
        code, _, err = run_cli(argv, capsys)
        assert code == 1 and seen[-1] is fast, err
    from tvm_roialign.cli._detector import build_fast

    for extra, fast in (([], True), (["--fast"], True), (["--exact"], False)):
        parsed = cli.build_parser().parse_args(["tune", "maskrcnn", *extra, "-o", "db"])
        assert build_fast(parsed) is fast
    with pytest.raises(SystemExit) as info:  # a usage error, as argparse reports them
        cli.main(["compile", "fasterrcnn_mobilenet_v3_large_fpn", "--fast", "--exact", "-o", out])
    assert info.value.code == 2
    assert "argument --exact: not allowed with argument --fast" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "mode"), [("--fast", "fast"), ("--exact", "exact")])
def test_mode_flags_reach_a_model_files_library(pt2_model, cli_workdir, capsys, flag, mode):
    """``--fast`` and ``--exact`` apply to a model file as to a detector: the mode in the summary
    line and in LIBRARY.json (what each builds: tests/test_cli_compile.py)."""
    model, _, _ = pt2_model
    out = cli_workdir / f"mode_{mode}.so"
    code, printed, err = run_cli(["compile", str(model), flag, "-o", str(out)], capsys)
    assert code == 0, err
    assert f", {mode}, " in printed, printed
    assert json.loads(Path(f"{out}.json").read_text())["mode"] == mode
