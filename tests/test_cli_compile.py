"""``tvm-roialign compile``, in-process, on the tiny models of tests/_cli_models.py (session fixtures
of tests/conftest.py): targets, layouts, input shapes, code dumps, cross targets, TVM's warnings,
every error path. Results are compared with PyTorch and onnxruntime.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from _cli import one_line_error, run_cli
from _cli_models import NUM_ROIS, write_onnx_model
from onnx import TensorProto, helper

from tvm_roialign import cli


def test_compile_defaults_native_nhwc_and_run(pt2_model, pt2_lib, cli_workdir, capsys):
    """No flags: this machine's CPU and NHWC; the result matches PyTorch."""
    _, inputs, expected = pt2_model
    meta = json.loads((cli_workdir / f"{pt2_lib.name}.json").read_text())
    assert meta["layout"] == "NHWC"
    assert meta["target"]["mcpu"] and meta["target"]["num-cores"] >= 1
    assert [(s["name"], s["shape"]) for s in meta["inputs"]] == [
        ("x", [1, 3, 32, 32]),
        ("rois", [NUM_ROIS, 5]),
    ]
    assert {"import_s", "convert_layout_s", "build_s", "export_s", "total_s"} <= set(meta["times"])
    outputs = cli_workdir / "tiny_default_out.npz"
    argv = ["run", str(pt2_lib), "--inputs", str(inputs), "--outputs", str(outputs)]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "first call" in out and "--print-time" in out
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "target, layout, expected_layout",
    [
        ("llvm -mcpu=native", "none", "none"),
        ("llvm-generic", "NCHW", "NCHW"),
        ('{"kind": "llvm"}', "NHWC", "NHWC"),
    ],
)
def test_compile_targets_and_layouts(pt2_model, cli_workdir, capsys, target, layout, expected_layout):
    model, inputs, expected = pt2_model
    lib = cli_workdir / f"tiny_{expected_layout}.so"
    code, out, err = run_cli(
        ["compile", str(model), "--target", target, "--desired-layout", layout, "-o", str(lib)], capsys
    )
    assert code == 0, err
    # the last line: target, layout, total and per-stage times
    assert re.search(
        rf"-> .*{lib.name} \(llvm.*, layout {expected_layout}, fp32, fast, \d+ kB\) in [\d.]+ s "
        r"\(import [\d.]+ s, .*"
        r"build [\d.]+ s, export [\d.]+ s\)",
        out,
    ), out
    assert json.loads((cli_workdir / f"{lib.name}.json").read_text())["layout"] == expected_layout
    outputs = cli_workdir / f"tiny_{expected_layout}_out.npz"
    code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys)
    assert code == 0, err
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "shape_args",
    [
        ["--input-shapes", "rois:[6,4] batch_indices:[6]"],
        ["--input-shapes", "rois:[6, 4], batch_indices:[6]"],
        ["--input-shape", "rois:6,4", "--input-shape", "batch_indices:6"],
    ],
)
def test_compile_onnx_input_shapes(onnx_model, cli_workdir, capsys, shape_args):
    model, inputs, expected = onnx_model
    lib = cli_workdir / "tiny_onnx.so"
    code, _, err = run_cli(["compile", str(model), *shape_args, "-o", str(lib)], capsys)
    assert code == 0, err
    meta = json.loads((cli_workdir / "tiny_onnx.so.json").read_text())
    assert [s["shape"] for s in meta["inputs"]] == [[1, 3, 32, 32], [NUM_ROIS, 4], [NUM_ROIS]]
    outputs = cli_workdir / "tiny_onnx_out.npz"
    code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys)
    assert code == 0, err
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


def test_dump_code(pt2_model, cli_workdir, capsys):
    model, _, _ = pt2_model
    lib = cli_workdir / "tiny_dump.so"
    argv = ["compile", str(model), "--dump-code", "relax,tir,ll,asm", "-o", str(lib), "-v"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "wrote tiny_dump.so.relax, tiny_dump.so.tir, tiny_dump.so.ll, tiny_dump.so.asm" in out
    # -v: the longest passes after the summary line, seconds and calls each, longest first
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("pass times"))
    assert lines[head - 1].startswith("compiled "), out
    rows = [re.fullmatch(r" +(\d+\.\d\d) s +(\d+) x +(\S.*)", line) for line in lines[head + 1:]]
    assert len(rows) == 15 and all(rows), lines[head:]
    seconds = [float(row[1]) for row in rows]
    assert seconds == sorted(seconds, reverse=True) and seconds[0] > 0
    assert "LegalizeOps" in [row[3].strip() for row in rows], lines[head:]
    relax_text = (cli_workdir / "tiny_dump.so.relax").read_text()
    assert "R.function" in relax_text and "roi_align" in relax_text
    assert 'layout="NHWC"' in relax_text  # ConvertLayout ran before the dump
    tir_text = (cli_workdir / "tiny_dump.so.tir").read_text()
    assert "T.prim_func" in tir_text and "roi_align" in tir_text
    llvm_ir = (cli_workdir / "tiny_dump.so.ll").read_text()
    kernels = re.findall(r"^def (\w+)\(", tir_text, re.M)
    assert kernels and all(f"@__tvm_ffi_{name}(" in llvm_ir for name in kernels), kernels  # both threads'
    assert ".text" in (cli_workdir / "tiny_dump.so.asm").read_text()


def test_compile_cross_target_to_tar(pt2_model, cli_workdir, capsys):
    """aarch64 builds here (LLVM cross) and exports as .tar; running it here is refused."""
    model, inputs, _ = pt2_model
    lib = cli_workdir / "tiny_aarch64.tar"
    code, out, err = run_cli(
        ["compile", str(model), "--target", "llvm -mtriple=aarch64-linux-gnu", "-o", str(lib)], capsys
    )
    assert code == 0, err
    assert lib.is_file() and "layout NHWC" in out
    for extra in ([], ["--device", "cpu"]):
        code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), *extra], capsys)
        assert code == 1
        one_line_error(err, "cross target")


def test_tvm_warnings_shown_once_or_hidden_with_quiet(gather_model, cli_workdir, capfd):
    lib = str(cli_workdir / "gather.so")
    code, _, err = run_cli(["compile", str(gather_model), "-o", lib], capfd, quiet=False)
    assert code == 0, err
    lines = [line for line in err.splitlines() if "Fast mode segfaults" in line]
    assert len(lines) == 1, err  # each distinct line once, however often TVM printed it
    code, out, err = run_cli(["compile", str(gather_model), "-o", lib, "-q"], capfd, quiet=False)
    assert code == 0 and err == "", err
    assert "compiled" in out


def test_compile_errors(pt2_model, onnx_model, cli_workdir, capfd):
    model, _, _ = pt2_model
    onnx_path, _, _ = onnx_model
    out = str(cli_workdir / "never.so")
    garbage = cli_workdir / "garbage.pt2"
    garbage.write_bytes(b"this is not a zip archive")
    bad_onnx = cli_workdir / "garbage.onnx"
    bad_onnx.write_bytes(b"\x00\x01not protobuf at all\xff" * 3)
    cases = [
        (["compile", str(cli_workdir / "missing.pt2"), "-o", out], ["does not exist"]),
        (["compile", str(garbage), "-o", out], ["cannot read", "torch.export.save"]),
        (["compile", str(bad_onnx), "-o", out], ["onnx"]),
        (
            ["compile", str(cli_workdir / "tiny_in.npz"), "-o", out],
            ["unknown model format", ".pt2 or .onnx", "detector name", "maskrcnn_resnet50_fpn"],
        ),
        (
            ["compile", str(model), "--tuning-records", str(cli_workdir / "no_records"), "-o", out],
            ["--tuning-records", "no_records", "does not exist"],
        ),
        (["compile", str(model), "--weights", str(garbage), "-o", out], ["--weights", "detector name"]),
        (["compile", str(model), "--input-size", "64x64", "-o", out], ["--input-size", "detector name"]),
        (["compile", str(onnx_path), "--seed", "1", "-o", out], ["--seed", "detector name"]),
        (["compile", str(model), "--min-size", "800", "-o", out], ["--min-size", "detector name"]),
        (["compile", str(model), "--max-size", "1333", "-o", out], ["--max-size", "detector name"]),
        (
            ["compile", "fasterrcnn_mobilenet_v3_large_fpn", "--input-size", "512", "-o", out],
            ["--input-size", "400x600,600x400", "any, all"],
        ),
        (
            ["compile", "fasterrcnn_mobilenet_v3_large_fpn", "--min-size", "8", "-o", out],
            ["--min-size", "at least 32"],
        ),
        (["compile", str(model), "--target", "tpu", "-o", out], ["--target", "unknown target"]),
        (["compile", str(model), "--target", '{"kind": "bogus"}', "-o", out], ["invalid target"]),
        (
            ["compile", str(model), "--target", "llvm -mcpu=skylak", "-o", out],
            ["--target", "did you mean skylake"],
        ),
        (
            ["compile", str(model), "--target", '{"kind": "llvm", "mcpu": "foo"}', "-o", out],
            ["--target", "no CPU 'foo'"],
        ),
        (["compile", str(model), "--desired-layout", "NCWH", "-o", out], ["NHWC, NCHW, none or auto"]),
        (
            ["compile", str(model), "--desired-layout-ops", "warp", "-o", out],
            ["--desired-layout-ops", "unknown op 'warp'"],
        ),
        (["compile", str(model), "-o", str(cli_workdir / "lib.txt")], [".so"]),
        (
            ["compile", str(model), "-o", str(cli_workdir / "no_such_dir" / "m.so")],
            ["folder", "does not exist"],
        ),
        (
            ["compile", str(model), "--input-shapes", "x:[1,3,32,32]", "-o", out],
            ["fixes its own input shapes"],
        ),
        (["compile", str(onnx_path), "--input-shapes", "x:1,3,32,32", "-o", out], ['"x:[1,3,224,224]']),
        (["compile", str(onnx_path), "--input-shapes", "x:[1,3,a]", "-o", out], ["integers"]),
        (
            ["compile", str(onnx_path), "--input-shapes", "y:[1]", "-o", out],
            ["names y", "x, rois, batch_indices"],
        ),
        (["compile", str(onnx_path), "--input-shape", "rois", "-o", out], ["NAME:1,3,224,224"]),
        (["compile", str(model), "--dump-code", "relay", "-o", out], ["--dump-code", "relax,tir,ll,asm"]),
    ]
    for argv, words in cases:
        code, _, err = run_cli(argv, capfd)
        assert code == 1, (argv, err)
        one_line_error(err, *words)
    assert not (cli_workdir / "never.so").exists()
    assert not (cli_workdir / "no_such_dir").exists()
    # without -q too, a missing model file is one line: no progress line before it
    code, _, err = run_cli(["compile", str(cli_workdir / "missing.pt2"), "-o", out], capfd,
                           quiet=False)
    assert code == 1
    one_line_error(err, "does not exist")


def test_compile_detector_weights_errors(cli_workdir, capsys):
    """--weights of a detector name that is not its state_dict: one line naming --weights (the
    torchvision model is built, nothing is compiled)."""
    garbage = cli_workdir / "garbage.pth"
    garbage.write_bytes(b"not a torch file")
    a_list = cli_workdir / "list.pth"
    torch.save([torch.zeros(2)], a_list)
    other = cli_workdir / "linear.pth"
    torch.save(torch.nn.Linear(2, 2).state_dict(), other)
    out = str(cli_workdir / "never_det.so")
    name = "fasterrcnn_mobilenet_v3_large_fpn"
    cases = [
        (garbage, ["not a PyTorch file written by torch.save"]),
        (a_list, ["holds a list, not a state_dict"]),
        (other, [f"not a {name} state_dict", "missing", "unexpected"]),
        (cli_workdir / "nothing.pth", ["does not exist"]),
    ]
    for weights, words in cases:
        code, _, err = run_cli(["compile", name, "--weights", str(weights), "-o", out], capsys)
        assert code == 1, (weights, err)
        one_line_error(err, "--weights", *words)
    assert not (cli_workdir / "never_det.so").exists()


def test_missing_package_names_the_pip_package():
    assert "'pillow' (module 'PIL')" in cli.missing_package("run", "PIL")
    assert "pip install pillow" in cli.missing_package("run", "PIL")
    assert "'scikit-image' (module 'skimage')" in cli.missing_package("maskrcnn", "skimage")
    assert 'pip install "tvm-roialign[cli]"' in cli.missing_package("maskrcnn", "skimage.data")
    assert 'pip install "tvm-roialign[onnx]"' in cli.missing_package("compile", "onnx")
    assert 'pip install "tvm-roialign[tune]"' in cli.missing_package("tune", "xgboost")
    assert 'pip install "tvm-roialign[tune]"' in cli.missing_package("tune", "cloudpickle")


def test_symbolic_onnx_inputs_get_one_note(cli_workdir, capsys):
    """An ONNX model with dynamic axes builds, with one note (not under -q) that the library runs at
    every size (--input-shapes for one), and one line saying which kernels the rules tiled."""
    path = write_onnx_model(
        cli_workdir / "dyn.onnx",
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
    )
    lib = str(cli_workdir / "dyn.so")
    code, _, err = run_cli(["compile", str(path), "-o", lib], capsys, quiet=False)
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1, err
    assert "x [batch, 3, height, width]" in notes[0], notes
    assert '--input-shapes "x:[1,3,224,224]"' in notes[0], notes
    assert "runs at every size" in notes[0] and "'symbolic shapes' line" in notes[0], notes
    code, out, err = run_cli(["compile", str(path), "-o", lib], capsys)
    assert code == 0 and "note:" not in err, err
    (line,) = [text for text in out.splitlines() if text.startswith("symbolic shapes:")]
    # NCHW relu: the innermost axis (width) is symbolic, so no vector of static lanes
    assert line == (
        "symbolic shapes: 0 of 1 kernels tiled, vectorized, parallel; 1 fell back: relu1 "
        "(scalar: no static innermost axis of 4 or more lanes)"
    ), out
    code, _, err = run_cli(
        ["compile", str(path), "--input-shapes", "x:[1,3,8,8]", "-o", lib], capsys, quiet=False
    )
    assert code == 0 and "note:" not in err, err


def test_missing_optional_dependency_is_one_line(pt2_model, cli_workdir, capsys, monkeypatch):
    """A core-only install (no torch) gets a one-line error naming the package, not a traceback."""
    model, _, _ = pt2_model
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ModuleNotFoundError
    code, _, err = run_cli(["compile", str(model), "-o", str(cli_workdir / "never.so")], capsys)
    assert code == 1
    one_line_error(err, "needs the Python package 'torch'", "pip install")


def test_int8_of_a_dynamic_batch_model_names_input_shapes_before_the_build(cli_workdir, capsys):
    """int8 calibrates on photos, which needs a static image input: a dynamic-batch ONNX model is
    refused before the build, with the --input-shapes that makes it work; that one then builds and
    runs as onnxruntime does, within int8's error."""
    ort = pytest.importorskip("onnxruntime")
    weight = np.random.default_rng(3).standard_normal((8, 3, 3, 3)).astype("float32")
    path = write_onnx_model(
        cli_workdir / "dyn_batch_conv.onnx",
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 16, 16])],
        [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel())],
    )
    lib = cli_workdir / "dyn_batch_int8.so"
    code, out, err = run_cli(["compile", str(path), "--precision", "int8", "-o", str(lib)], capsys)
    assert code == 1, err
    one_line_error(err, "--precision int8", "x float32 [batch, 3, 16, 16]",
                   '--input-shapes "x:[1,3,16,16]"')
    assert not lib.exists() and "compiled" not in out
    code, _, err = run_cli(
        ["compile", str(path), "--precision", "int8", "--input-shapes", "x:[1,3,16,16]", "-o", str(lib)],
        capsys,
    )
    assert code == 0, err
    x = np.random.default_rng(4).standard_normal((1, 3, 16, 16)).astype("float32")
    inputs, outputs = cli_workdir / "dyn_batch_in.npz", cli_workdir / "dyn_batch_out.npz"
    np.savez(inputs, x=x)
    code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys)
    assert code == 0, err
    expected = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    with np.load(outputs) as got:
        # int8: within a few quantization steps of the output's range
        np.testing.assert_allclose(got["output_0"], expected, atol=0.05 * np.abs(expected).max())


def test_compile_detector_records_the_weights_origin(cli_workdir, capsys, monkeypatch):
    """The detector's metadata says where its weights come from: ``random, seed N``, or the
    state_dict's file name and sha256 prefix (hashlib's). The build itself is replaced by a stub
    (the record is the CLI's); ``maskrcnn``'s caption names the same."""
    import hashlib
    import types

    from tvm_roialign.models import detection
    from tvm_roialign.models.detection import DetectorConfig, build_torch_detector

    def fake_compile(model, *_args, **_kwargs):
        def export(path):
            Path(f"{path}.json").write_text(json.dumps(artifact.meta))
            Path(path).write_bytes(b"")

        artifact = types.SimpleNamespace(
            meta={"mode": "exact", "buckets": [], "any_size": {"min_side": 96, "max_side": 4096}},
            import_s=0.0, compile_s=0.0, export=export,
        )
        return artifact

    monkeypatch.setattr(detection, "compile_detector", fake_compile)
    name = "fasterrcnn_mobilenet_v3_large_fpn"
    weights = cli_workdir / "mobilenet_weights.pth"
    torch.save(build_torch_detector(name, DetectorConfig(seed=11)).state_dict(), weights)
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
    cases = [
        ([name, "--seed", "5"], "random, seed 5"),
        ([name, "--weights", str(weights)], f"mobilenet_weights.pth, sha256 {digest}"),
    ]
    out = cli_workdir / "weights_origin.so"
    for argv, expected in cases:
        code, _, err = run_cli(["compile", *argv, "-o", str(out)], capsys)
        assert code == 0, (argv, err)
        assert json.loads(Path(f"{out}.json").read_text())["weights"] == expected, argv
    from tvm_roialign.bench.report import MaskRCNNReport, RunConfig

    for seed, path, expected in ((3, None, "random weights (seed 3)"),
                                 (None, str(weights), f"weights mobilenet_weights.pth, sha256 {digest}")):
        config = RunConfig(image="astronaut", weights=path or "random", seed=seed, target={"kind": "llvm"})
        caption = MaskRCNNReport.caption(types.SimpleNamespace(config=config, comparison=None))
        assert expected in caption, caption


def test_exact_model_file_has_no_winograd_and_matches_onnxruntime(cli_workdir, capsys):
    """``compile model.onnx --exact``: direct convolutions (no Winograd kernel in the library's
    kernels), the output within float32 rounding of onnxruntime's and PyTorch's; the default (fast)
    build of the same file has Winograd kernels. The summary line gives the mode and the size."""
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1)
    ).eval()
    x = torch.randn(1, 64, 56, 56)
    path = cli_workdir / "convs.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17, input_names=["x"])
    inputs = cli_workdir / "convs_in.npz"
    np.savez(inputs, x=x.numpy())
    expected = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    with torch.no_grad():
        eager = model(x).numpy()
    kernels = {}
    for mode in ("exact", "fast"):
        lib = cli_workdir / f"convs_{mode}.so"
        code, out, err = run_cli(["compile", str(path), f"--{mode}", "-o", str(lib)], capsys)
        assert code == 0, err
        ((shown, unit),) = re.findall(rf", fp32, {mode}, ([\d.]+) (kB|MB)\) in ", out)
        scale, rounding = (1e6, 0.05e6) if unit == "MB" else (1e3, 500)
        assert abs(float(shown) * scale - lib.stat().st_size) <= rounding, out
        meta = json.loads(Path(f"{lib}.json").read_text())
        assert meta["mode"] == mode
        kernels[mode] = [k["name"] for k in meta["kernels"]]
        outputs = cli_workdir / f"convs_{mode}_out.npz"
        code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys)
        assert code == 0, err
        with np.load(outputs) as got:
            result = got["output_0"]
        if mode == "exact":
            np.testing.assert_allclose(result, expected, rtol=1e-5, atol=2e-5)
            np.testing.assert_allclose(result, eager, rtol=1e-5, atol=2e-5)
    assert not [k for k in kernels["exact"] if "winograd" in k], kernels["exact"]
    assert [k for k in kernels["fast"] if "winograd" in k], kernels["fast"]
