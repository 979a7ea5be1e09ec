"""The ``tvm-roialign`` command line: compile, run and maskrcnn, with their error paths.

The models are tiny (a conv followed by RoIAlign) exported to ``.pt2`` and written as ``.onnx``;
the ``maskrcnn`` run uses a reduced configuration (128-pixel image, 40 proposals, 8 detections).
Results are compared with PyTorch and onnxruntime.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
onnx = pytest.importorskip("onnx")

from tvm_roialign import cli
from tvm_roialign.passes import desired_layouts
from tvm_roialign.target import parse_target

NUM_ROIS = 6


class _TinyRoi(torch.nn.Module):
    """conv 3x3 (3 -> 8) at half resolution, then torchvision roi_align 7x7 (aligned=True)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)

    def forward(self, x, rois):
        return torchvision.ops.roi_align(
            self.conv(x), rois, (7, 7), 0.5, 2, aligned=True
        )


def _rois(num=NUM_ROIS, size=32, seed=0):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, size * 0.6, (num, 2))
    wh = rng.uniform(2, size * 0.4, (num, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1)
    return np.concatenate([np.zeros((num, 1)), boxes], axis=1).astype("float32")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def pt2_model(workdir):
    model = _TinyRoi().eval()
    x = torch.from_numpy(
        np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype("float32")
    )
    rois = torch.from_numpy(_rois())
    exported = torch.export.export(model, (x, rois))
    path = workdir / "tiny.pt2"
    torch.export.save(exported, str(path))
    with torch.no_grad():
        expected = model(x, rois).numpy()
    inputs = workdir / "tiny_in.npz"
    names = [
        spec.arg.name
        for spec in exported.graph_signature.input_specs
        if spec.kind.name == "USER_INPUT"
    ]
    np.savez(inputs, **dict(zip(names, (x.numpy(), rois.numpy()))))
    return path, inputs, expected


@pytest.fixture(scope="module")
def onnx_model(workdir):
    from onnx import TensorProto, helper

    rng = np.random.default_rng(2)
    weight = rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.2
    bias = rng.standard_normal(8).astype("float32") * 0.1
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]
        ),
        helper.make_node(
            "RoiAlign",
            ["y", "rois", "batch_indices"],
            ["out"],
            output_height=7,
            output_width=7,
            sampling_ratio=2,
            spatial_scale=0.5,
            coordinate_transformation_mode="half_pixel",
            mode="avg",
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_roi",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32]),
            helper.make_tensor_value_info("rois", TensorProto.FLOAT, [NUM_ROIS, 4]),
            helper.make_tensor_value_info(
                "batch_indices", TensorProto.INT64, [NUM_ROIS]
            ),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [NUM_ROIS, 8, 7, 7])],
        initializer=[
            helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel()),
            helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    path = workdir / "tiny.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((1, 3, 32, 32)).astype("float32")
    rois = _rois(seed=3)[:, 1:].copy()
    batch_indices = np.zeros(NUM_ROIS, dtype="int64")
    inputs = workdir / "tiny_onnx_in.npz"
    np.savez(inputs, x=x, rois=rois, batch_indices=batch_indices)
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (expected,) = sess.run(
            None, {"x": x, "rois": rois, "batch_indices": batch_indices}
        )
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        (expected,) = ReferenceEvaluator(model).run(
            None, {"x": x, "rois": rois, "batch_indices": batch_indices}
        )
    return path, inputs, expected


def _cli(argv, capsys):
    code = cli.main(["--quiet", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line_error(err: str, *words):
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tvm-roialign: error: "), err
    for word in words:
        assert word.lower() in lines[0].lower(), (word, lines[0])


# ---------------------------------------------------------------------------------------------
# targets and layouts


@pytest.mark.parametrize(
    "text, kind, attr",
    [
        ("llvm", "llvm", None),
        ("aarch64", "llvm", ("mtriple", "aarch64-linux-gnu")),
        ("cuda", "cuda", ("arch", "sm_80")),
        ("metal", "metal", None),
        (
            '{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}',
            "llvm",
            ("mtriple", "aarch64-linux-gnu"),
        ),
    ],
)
def test_parse_target(text, kind, attr):
    target = parse_target(text)
    assert target.kind.name == kind
    if attr:
        assert str(target.attrs.get(attr[0])) == attr[1]


@pytest.mark.parametrize("text", ["tpu", '{"kind": "bogus"}', '{"kind": ', '["llvm"]'])
def test_parse_target_rejects(text):
    with pytest.raises(ValueError, match="target"):
        parse_target(text)


def test_desired_layouts():
    layouts = desired_layouts("nhwc", "roi_align,conv2d")
    assert layouts["relax.nn.conv2d"] == ["NHWC", "default"]
    assert layouts["relax.vision.roi_align"] == ["NHWC", "default"]
    assert "relax.vision.multiscale_roi_align" in layouts
    assert set(desired_layouts("NHWC", "conv2d")) == {"relax.nn.conv2d"}
    with pytest.raises(ValueError, match="NCHW or NHWC"):
        desired_layouts("NCWH", None)
    with pytest.raises(ValueError, match="unknown op"):
        desired_layouts("NHWC", "roi_align,softmax")


# ---------------------------------------------------------------------------------------------
# compile + run


@pytest.mark.parametrize("layout", ["NHWC", None])
def test_compile_and_run_pt2(pt2_model, workdir, layout, capsys):
    model, inputs, expected = pt2_model
    lib = workdir / f"tiny_pt2_{layout}.so"
    argv = ["compile", str(model), "--target", "llvm", "-o", str(lib)]
    if layout:
        argv += ["--desired-layout", layout, "--desired-layout-ops", "roi_align,conv2d"]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    assert lib.is_file() and "compiled" in out
    meta = json.loads((workdir / f"{lib.name}.json").read_text())
    assert [spec["shape"] for spec in meta["inputs"]] == [[1, 3, 32, 32], [NUM_ROIS, 5]]
    outputs = workdir / f"tiny_pt2_{layout}_out.npz"
    code, _, err = _cli(
        ["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys
    )
    assert code == 0, err
    with np.load(outputs) as result:
        got = result["output_0"]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_compile_and_run_onnx(onnx_model, workdir, capsys):
    model, inputs, expected = onnx_model
    lib = workdir / "tiny_onnx.so"
    code, _, err = _cli(
        [
            "compile",
            str(model),
            "--target",
            '{"kind": "llvm"}',
            "--desired-layout",
            "NHWC",
            "-o",
            str(lib),
        ],
        capsys,
    )
    assert code == 0, err
    outputs = workdir / "tiny_onnx_out.npz"
    code, _, err = _cli(
        ["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys
    )
    assert code == 0, err
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


def test_compile_cross_target_to_tar(pt2_model, workdir, capsys):
    """aarch64 builds here (LLVM cross) and exports as .tar; running it here is refused."""
    model, inputs, _ = pt2_model
    lib = workdir / "tiny_aarch64.tar"
    code, _, err = _cli(
        ["compile", str(model), "--target", "aarch64", "-o", str(lib)], capsys
    )
    assert code == 0, err
    assert lib.is_file()
    code, _, err = _cli(
        ["run", str(lib), "--inputs", str(inputs), "--outputs", str(workdir / "x.npz")],
        capsys,
    )
    assert code == 1
    _one_line_error(err, "cross target")


# ---------------------------------------------------------------------------------------------
# compile / run errors


def test_compile_errors(pt2_model, workdir, capsys):
    model, _, _ = pt2_model
    out = str(workdir / "never.so")
    garbage = workdir / "garbage.pt2"
    garbage.write_bytes(b"this is not a zip archive")
    bad_onnx = workdir / "garbage.onnx"
    bad_onnx.write_bytes(b"\x00\x01not protobuf at all\xff" * 3)
    cases = [
        (["compile", str(workdir / "missing.pt2"), "-o", out], "does not exist"),
        (["compile", str(garbage), "-o", out], "cannot read"),
        (["compile", str(bad_onnx), "-o", out], "onnx"),
        (["compile", str(workdir / "tiny_in.npz"), "-o", out], "unknown model format"),
        (["compile", str(model), "--target", "tpu", "-o", out], "unknown target"),
        (
            ["compile", str(model), "--target", '{"kind": "bogus"}', "-o", out],
            "invalid target",
        ),
        (
            ["compile", str(model), "--desired-layout", "NCWH", "-o", out],
            "NHWC, NCHW, none or auto",
        ),
        (
            [
                "compile",
                str(model),
                "--desired-layout",
                "NHWC",
                "--desired-layout-ops",
                "warp",
                "-o",
                out,
            ],
            "unknown op",
        ),
        (["compile", str(model), "-o", str(workdir / "lib.txt")], ".so"),
    ]
    for argv, words in cases:
        code, _, err = _cli(argv, capsys)
        assert code == 1, (argv, err)
        _one_line_error(err, words)
    assert not (workdir / "never.so").exists()


def test_missing_optional_dependency_is_one_line(pt2_model, workdir, capsys, monkeypatch):
    """A core-only install (no torch) gets a one-line error naming the package, not a traceback."""
    model, _, _ = pt2_model
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ModuleNotFoundError
    code, _, err = _cli(["compile", str(model), "-o", str(workdir / "never.so")], capsys)
    assert code == 1
    _one_line_error(err, "needs the Python package 'torch'", "pip install")


def test_run_errors(pt2_model, workdir, capsys):
    model, inputs, _ = pt2_model
    lib = workdir / "tiny_pt2_NHWC.so"
    if not lib.is_file():
        code, _, err = _cli(["compile", str(model), "-o", str(lib)], capsys)
        assert code == 0, err
    missing_name = workdir / "missing_name.npz"
    np.savez(
        missing_name,
        x=np.zeros((1, 3, 32, 32), "float32"),
        other=np.zeros((NUM_ROIS, 5), "float32"),
    )
    with np.load(inputs) as npz:
        names = list(npz.files)
    wrong_shape = workdir / "wrong_shape.npz"
    np.savez(
        wrong_shape,
        **{names[0]: np.zeros((1, 3, 16, 16), "float32"), names[1]: _rois()},
    )
    not_npz = workdir / "not.npz"
    not_npz.write_text("hello")
    not_lib = workdir / "not_a_lib.so"
    not_lib.write_text("hello")
    out = str(workdir / "o.npz")
    cases = [
        (
            [
                "run",
                str(workdir / "missing.so"),
                "--inputs",
                str(inputs),
                "--outputs",
                out,
            ],
            "does not exist",
        ),
        (
            ["run", str(not_lib), "--inputs", str(inputs), "--outputs", out],
            "cannot load",
        ),
        (
            ["run", str(lib), "--inputs", str(workdir / "none.npz"), "--outputs", out],
            "does not exist",
        ),
        (["run", str(lib), "--inputs", str(not_npz), "--outputs", out], "npz"),
        (
            ["run", str(lib), "--inputs", str(missing_name), "--outputs", out],
            "lacks",
        ),
        (["run", str(lib), "--inputs", str(wrong_shape), "--outputs", out], "shape"),
    ]
    for argv, words in cases:
        code, _, err = _cli(argv, capsys)
        assert code == 1, (argv, err)
        _one_line_error(err, words)


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["compile"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        cli.main(["frobnicate"])
    assert info.value.code == 2
    capsys.readouterr()


def test_python_m_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "tvm_roialign", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("compile", "run", "maskrcnn"):
        assert command in proc.stdout


# ---------------------------------------------------------------------------------------------
# maskrcnn


def test_maskrcnn_reduced(workdir, capsys):
    """The main-job command on a reduced configuration: picture, report and agreement."""
    (workdir / "mask").mkdir()
    out = workdir / "mask" / "result.png"
    argv = [
        "maskrcnn",
        "--out",
        str(out),
        "--min-size",
        "128",
        "--proposals",
        "40",
        "--detections",
        "8",
        "--repeat",
        "1",
        "--check",
    ]
    code, stdout, err = _cli(argv, capsys)
    assert code == 0, err + stdout
    assert out.is_file()
    from PIL import Image

    with Image.open(out) as picture:
        assert picture.width == 512 and picture.height > 512  # the caption strip below
    report = json.loads(out.with_suffix(".json").read_text())
    cmp = report["comparison"]
    assert (
        cmp["passed"] and cmp["num_detections_tvm"] == cmp["num_detections_torch"] > 0
    )
    assert (
        cmp["same_labels"]
        and cmp["max_box_diff"] <= 1e-2
        and cmp["mask_pixel_agreement"] >= 0.999
    )
    assert report["transposes"]["adjacent_to_roi_align_after"] == 0
    assert report["transposes"]["adjacent_to_roi_align_before"] > 0
    for piece in ("backbone", "box_branch", "mask_branch"):
        assert report["pieces"][piece]["tvm_compile_s"] > 0
        assert report["pieces"][piece]["tvm_run_s"] > 0
        assert report["pieces"][piece]["torch_run_s"] > 0
    roi = report["roi_align"]
    assert set(roi["per_head"]) == {"box_branch", "mask_branch"}
    for head in roi["per_head"].values():
        assert head["max_abs_diff_ours_vs_stock"] < 1e-3
    assert "PASS" in stdout


def test_maskrcnn_errors(workdir, capsys):
    not_image = workdir / "not_image.png"
    not_image.write_text("hello")
    not_weights = workdir / "weights.pt"
    torch.save({"conv.weight": torch.zeros(1)}, not_weights)
    out = str(workdir / "r.png")
    cases = [
        (
            ["maskrcnn", "--image", str(workdir / "missing.jpg"), "--out", out],
            "does not exist",
        ),
        (["maskrcnn", "--image", str(not_image), "--out", out], "not a readable image"),
        (["maskrcnn", "--target", "tpu", "--out", out], "unknown target"),
        (["maskrcnn", "--layout", "NWHC", "--out", out], "NCHW or NHWC"),
        (["maskrcnn", "--out", str(workdir / "r.gif")], ".png"),
        (
            ["maskrcnn", "--weights", str(workdir / "missing.pth"), "--out", out],
            "does not exist",
        ),
        (["maskrcnn", "--weights", str(not_weights), "--out", out], "state_dict"),
        (["maskrcnn", "--target", "aarch64", "--out", out], "cross target"),
    ]
    for argv, words in cases:
        code, _, err = _cli(argv, capsys)
        assert code == 1, (argv, err)
        _one_line_error(err, words)


def test_maskrcnn_compile_only_cross_target(workdir, capsys):
    """--compile-only builds the three graphs for a target this machine cannot run (aarch64)."""
    (workdir / "cross").mkdir()
    out = workdir / "cross" / "result.png"
    argv = [
        "maskrcnn",
        "--target",
        "aarch64",
        "--compile-only",
        "--out",
        str(out),
        "--min-size",
        "64",
        "--proposals",
        "10",
        "--detections",
        "4",
    ]
    code, stdout, err = _cli(argv, capsys)
    assert code == 0, err + stdout
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["compile_only"] and report["config"]["target"]["mtriple"] == "aarch64-linux-gnu"
    assert set(report["pieces"]) == {"backbone", "box_branch", "mask_branch"}
    for counts in report["transposes"]["per_piece"].values():
        assert counts["adjacent_to_roi_align_after"] == 0
    assert not out.exists()
