"""``tvm-roialign maskrcnn`` (the reduced configuration, errors, a cross target) and the detectors'
``--min-size`` / ``--max-size``, in-process.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from _cli import one_line_error, run_cli

from tvm_roialign import cli


def _schema_keys(obj, prefix=""):
    """Every key of the report, nested ones as ``parent.key`` (pieces as ``pieces.<piece>.key``)."""
    for key, value in obj.items():
        name = f"{prefix}{key}"
        yield name
        if isinstance(value, dict) and key not in ("per_piece", "per_head", "target"):
            sub = f"{name}.<piece>." if key == "pieces" else f"{name}."
            yield from _schema_keys(next(iter(value.values())) if key == "pieces" else value, sub)


def test_maskrcnn_reduced(cli_workdir, capsys, monkeypatch):
    """The main-job command on a reduced configuration, its default (fast) build: picture,
    caption, report (every field in its schema) and agreement by the fast criterion."""
    from tvm_roialign.models import maskrcnn as mr

    captions = []
    draw = mr.draw_detections

    def recording_draw(*args, caption=None, **kwargs):
        captions.append(caption)
        return draw(*args, caption=caption, **kwargs)

    monkeypatch.setattr(mr, "draw_detections", recording_draw)
    (cli_workdir / "mask").mkdir()
    out = cli_workdir / "mask" / "result.png"
    argv = ["maskrcnn", "--out", str(out), "--min-size", "128", "--proposals", "40", "--detections", "8"]
    code, stdout, err = run_cli([*argv, "--repeat", "1", "--check"], capsys)  # the default: fast
    assert code == 0, err + stdout
    from PIL import Image

    with Image.open(out) as picture:
        assert picture.width == 512 and picture.height > 512  # the caption strip below the photo
    report = json.loads(out.with_suffix(".json").read_text())
    schema = report.pop("schema")
    assert all(isinstance(text, str) and text for text in schema.values())
    assert set(_schema_keys(report)) <= set(schema), set(_schema_keys(report)) - set(schema)
    assert "detections" not in report
    cmp = report["comparison"]
    [caption] = captions
    assert caption.startswith("TVM llvm") and "random weights (seed 3)" in caption
    assert f"; PASS against PyTorch eager ({cmp['num_detections_tvm']} detections)" in caption
    assert cmp["passed"] and cmp["num_detections_tvm"] == cmp["num_detections_torch"] > 0
    # the fast criterion (the exact build of the same pieces: tests/test_maskrcnn.py)
    assert cmp["mode"] == "fast" and cmp["checked_torch"] == cmp["num_detections_torch"], cmp
    assert cmp["unmatched_torch"] == cmp["unmatched_tvm"] == 0 and cmp["min_box_iou"] >= 0.99, cmp
    assert cmp["mask_pixel_agreement"] >= 0.999, cmp
    assert report["config"]["target"]["mcpu"]  # the default target is this machine's CPU
    assert report["transposes"]["adjacent_to_roi_align_after"] == 0
    assert report["transposes"]["adjacent_to_roi_align_before"] > 0
    for piece in ("backbone", "box_branch", "mask_branch"):
        for key in ("tvm_import_s", "tvm_compile_s", "tvm_run_s", "torch_run_s"):
            assert isinstance(report["pieces"][piece][key], float), (piece, key)
    env = report["environment"]
    assert env["tvm_version"] and env["torch_version"] and env["package_version"] and env["cpu_model"]
    roi = report["roi_align"]
    assert set(roi["per_head"]) == {"box_branch", "mask_branch"}
    for head in roi["per_head"].values():
        assert head["max_abs_diff_ours_vs_stock"] < 1e-3
    assert "PASS" in stdout and "end to end" in stdout


def test_maskrcnn_errors(cli_workdir, capsys):
    not_image = cli_workdir / "not_image.png"
    not_image.write_text("hello")
    other_model = cli_workdir / "weights.pt"
    torch.save({"conv.weight": torch.zeros(1)}, other_model)
    text_weights = cli_workdir / "weights.txt"
    text_weights.write_text("hello")
    tensor_weights = cli_workdir / "tensor.pt"
    torch.save(torch.zeros(3), tensor_weights)
    out = str(cli_workdir / "r.png")
    cases = [
        (["--image", str(cli_workdir / "missing.jpg")], ["--image", "does not exist"]),
        (["--image", str(not_image)], ["--image", "not a readable image"]),
        (["--target", "tpu"], ["--target", "unknown target"]),
        (["--layout", "NWHC"], ["NCHW or NHWC"]),
        (["--weights", str(cli_workdir / "missing.pth")], ["--weights", "does not exist"]),
        (["--weights", str(other_model)], ["--weights", "not a maskrcnn_resnet50_fpn state_dict", "missing"]),
        (["--weights", str(text_weights)], ["--weights", "not a PyTorch file written by torch.save"]),
        (["--weights", str(tensor_weights)], ["--weights", "holds a Tensor, not a state_dict"]),
        (["--target", "aarch64"], ["cross target"]),
    ]
    for extra, words in cases:
        code, _, err = run_cli(["maskrcnn", "--out", out, *extra], capsys)
        assert code == 1, (extra, err)
        one_line_error(err, *words)
    for bad_out, words in (
        (str(cli_workdir / "r.gif"), [".png"]),
        (str(cli_workdir / "nowhere" / "r.png"), ["folder"]),
    ):
        code, _, err = run_cli(["maskrcnn", "--out", bad_out], capsys)
        assert code == 1
        one_line_error(err, "--out", *words)
    assert not (cli_workdir / "nowhere").exists()


def test_maskrcnn_compile_only_cross_target(cli_workdir, capsys):
    """--compile-only builds the three graphs for a target this machine cannot run (aarch64)."""
    out = cli_workdir / "cross.png"
    argv = ["maskrcnn", "--target", "aarch64", "--compile-only", "--out", str(out)]
    code, stdout, err = run_cli([*argv, "--min-size", "64", "--proposals", "10", "--detections", "4"], capsys)
    assert code == 0, err + stdout
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["compile_only"] and report["config"]["target"]["mtriple"] == "aarch64-linux-gnu"
    assert set(report["pieces"]) == {"backbone", "box_branch", "mask_branch"}
    for counts in report["transposes"]["per_piece"].values():
        assert counts["adjacent_to_roi_align_after"] == 0
    assert not out.exists()


def test_detector_resize_bounds(monkeypatch, cli_workdir, capsys):
    """--min-size / --max-size of a detector name are torchvision's min_size / max_size: 512 / 512
    by default, --min-size 800 alone is torchvision's own 800 / 1333; the model is built with
    them and --input-size gives the photo sizes (compile stopped before the build)."""
    from argparse import Namespace

    from tvm_roialign.cli._detector import _bounds
    from tvm_roialign.models import detection

    assert _bounds(Namespace(min_size=None, max_size=None)) == (512, 512)
    assert _bounds(Namespace(min_size=800, max_size=None)) == (800, 1333)
    assert _bounds(Namespace(min_size=600, max_size=1000)) == (600, 1000)
    seen = {}

    def stop(model, sizes, *args, **kwargs):
        seen["bounds"] = (model.transform.min_size, model.transform.max_size)
        seen["padded"] = detection.bucket_sizes(model.transform, sizes)
        raise ValueError("stopped before the build")

    monkeypatch.setattr(detection, "compile_detector", stop)
    name = "fasterrcnn_mobilenet_v3_large_fpn"
    argv = ["compile", name, "--min-size", "800", "--input-size", "400x600,600x400", "-o",
            str(cli_workdir / "never.so")]
    code, _, err = run_cli(argv, capsys)
    assert code == 1 and "stopped before the build" in err, err
    assert seen == {"bounds": ((800,), 1333), "padded": [(800, 1216), (1216, 800)]}


def test_maskrcnn_resize_bounds_are_compiles():
    """``maskrcnn --min-size 800`` builds torchvision's 800 / 1333 as ``compile NAME --min-size
    800`` does (it built 800 / 800); 512 / 512 by default; both flags given, as given."""
    import types

    from tvm_roialign.cli.maskrcnn import model_inputs
    from tvm_roialign.models.maskrcnn import MaskRCNNConfig

    fake = types.SimpleNamespace(load_image=lambda path: None, MaskRCNNConfig=MaskRCNNConfig,
                                 build_torch_model=lambda config: None)
    parser = cli.build_parser()
    for flags, bounds in (([], (512, 512)), (["--min-size", "800"], (800, 1333)),
                          (["--min-size", "600", "--max-size", "1000"], (600, 1000))):
        _, config, _ = model_inputs(parser.parse_args(["maskrcnn", *flags]), fake)
        assert (config.min_size, config.max_size) == bounds, flags
