"""The ``tvm-roialign`` command line, in-process: parser, compile, run, maskrcnn, every error path.

The models are tiny: a conv followed by RoIAlign exported to ``.pt2`` and written as ``.onnx``, and an
ONNX Gather (whose build makes TVM's C++ code print a warning). Results are compared with PyTorch and
onnxruntime. No test times anything; timing flags are checked for what they print.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
onnx = pytest.importorskip("onnx")

from _cli import one_line_error, run_cli
from onnx import TensorProto, helper

from tvm_roialign import cli

NUM_ROIS = 6


class _TinyRoi(torch.nn.Module):
    """conv 3x3 (3 -> 8) at half resolution, then torchvision roi_align 7x7 (aligned=True)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)

    def forward(self, x, rois):
        return torchvision.ops.roi_align(self.conv(x), rois, (7, 7), 0.5, 2, aligned=True)


def _rois(num=NUM_ROIS, size=32, seed=0):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, size * 0.6, (num, 2))
    wh = rng.uniform(2, size * 0.4, (num, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1)
    return np.concatenate([np.zeros((num, 1)), boxes], axis=1).astype("float32")


def _onnx_model(path, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def pt2_model(workdir):
    """(model.pt2, inputs.npz with the program's input names, the expected output)."""
    model = _TinyRoi().eval()
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype("float32"))
    rois = torch.from_numpy(_rois())
    exported = torch.export.export(model, (x, rois))
    path = workdir / "tiny.pt2"
    torch.export.save(exported, str(path))
    with torch.no_grad():
        expected = model(x, rois).numpy()
    names = [s.arg.name for s in exported.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert names == ["x", "rois"]
    inputs = workdir / "tiny_in.npz"
    np.savez(inputs, x=x.numpy(), rois=rois.numpy())
    return path, inputs, expected


@pytest.fixture(scope="module")
def onnx_model(workdir):
    """An ONNX conv + RoiAlign with a symbolic roi count ``N`` (for --input-shapes)."""
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((8, 3, 3, 3)).astype("float32") * 0.2
    bias = rng.standard_normal(8).astype("float32") * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]),
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
    path = _onnx_model(
        workdir / "tiny.onnx",
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32]),
            helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("batch_indices", TensorProto.INT64, ["N"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 8, 7, 7])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel()),
            helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias),
        ],
    )
    feeds = {
        "x": rng.standard_normal((1, 3, 32, 32)).astype("float32"),
        "rois": _rois(seed=3)[:, 1:].copy(),
        "batch_indices": np.zeros(NUM_ROIS, dtype="int64"),
    }
    inputs = workdir / "tiny_onnx_in.npz"
    np.savez(inputs, **feeds)
    ort = pytest.importorskip("onnxruntime")  # the expected output only: the file needs onnx alone
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (expected,) = sess.run(None, feeds)
    return path, inputs, expected


@pytest.fixture(scope="module")
def gather_model(workdir):
    """ONNX Gather + Relu: TVM's build of a Gather prints a C++ warning ("Fast mode segfaults...")."""
    nodes = [helper.make_node("Gather", ["x", "i"], ["y"], axis=0), helper.make_node("Relu", ["y"], ["z"])]
    return _onnx_model(
        workdir / "gather.onnx",
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])],
    )


@pytest.fixture(scope="module")
def pt2_lib(pt2_model, workdir):
    """The tiny .pt2 model compiled with every default (native target, NHWC)."""
    model, _, _ = pt2_model
    lib = workdir / "tiny_default.so"
    assert cli.main(["-q", "compile", str(model), "-o", str(lib)]) == 0
    return lib


# ---------------------------------------------------------------------------------------------
# the parser


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert re.match(r"tvm-roialign \d+\.\d+\.\d+ \(Apache TVM .+\)", out), out


@pytest.mark.parametrize(
    "command, defaults",
    [
        ("compile", ["(default: native)", "(default: auto)", "(default: conv2d,roi_align)"]),
        ("run", ["(default: random)", "(default: 1)"]),
        ("maskrcnn", ["(default: native)", "(default: NHWC)", "(default: result.png)", "(default: 3)"]),
    ],
)
def test_help_shows_defaults(command, defaults, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for default in defaults:
        assert default in out, (default, out)
    assert "(default: None)" not in out and "(default: False)" not in out


def test_global_options_before_or_after_the_subcommand():
    parser = cli.build_parser()
    for argv in (["-q", "run", "m.so"], ["run", "m.so", "-q"], ["run", "-q", "m.so"]):
        assert parser.parse_args(argv).quiet, argv
    assert not parser.parse_args(["run", "m.so"]).quiet


def test_every_subcommand_registers_itself():
    names = {action.dest for action in cli.build_parser()._subparsers._group_actions[0]._choices_actions}
    assert {"compile", "run", "maskrcnn"} <= names
    assert all(hasattr(module, "register") for module in cli.SUBCOMMANDS)


def test_usage_errors_exit_2(capsys):
    for argv in (["compile"], ["frobnicate"], ["run", "x.so", "--fill-mode", "twos"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
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
# compile


def test_compile_defaults_native_nhwc_and_run(pt2_model, pt2_lib, workdir, capsys):
    """No flags: this machine's CPU and NHWC; the result matches PyTorch."""
    _, inputs, expected = pt2_model
    meta = json.loads((workdir / f"{pt2_lib.name}.json").read_text())
    assert meta["layout"] == "NHWC"
    assert meta["target"]["mcpu"] and meta["target"]["num-cores"] >= 1
    assert [(s["name"], s["shape"]) for s in meta["inputs"]] == [
        ("x", [1, 3, 32, 32]),
        ("rois", [NUM_ROIS, 5]),
    ]
    assert {"import_s", "convert_layout_s", "build_s", "export_s", "total_s"} <= set(meta["times"])
    outputs = workdir / "tiny_default_out.npz"
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
def test_compile_targets_and_layouts(pt2_model, workdir, capsys, target, layout, expected_layout):
    model, inputs, expected = pt2_model
    lib = workdir / f"tiny_{expected_layout}.so"
    code, out, err = run_cli(
        ["compile", str(model), "--target", target, "--desired-layout", layout, "-o", str(lib)], capsys
    )
    assert code == 0, err
    # the last line: target, layout, total and per-stage times
    assert re.search(
        rf"-> .*{lib.name} \(llvm.*, layout {expected_layout}\) in [\d.]+ s \(import [\d.]+ s, .*"
        r"build [\d.]+ s, export [\d.]+ s\)",
        out,
    ), out
    assert json.loads((workdir / f"{lib.name}.json").read_text())["layout"] == expected_layout
    outputs = workdir / f"tiny_{expected_layout}_out.npz"
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
def test_compile_onnx_input_shapes(onnx_model, workdir, capsys, shape_args):
    model, inputs, expected = onnx_model
    lib = workdir / "tiny_onnx.so"
    code, _, err = run_cli(["compile", str(model), *shape_args, "-o", str(lib)], capsys)
    assert code == 0, err
    meta = json.loads((workdir / "tiny_onnx.so.json").read_text())
    assert [s["shape"] for s in meta["inputs"]] == [[1, 3, 32, 32], [NUM_ROIS, 4], [NUM_ROIS]]
    outputs = workdir / "tiny_onnx_out.npz"
    code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys)
    assert code == 0, err
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


def test_dump_code(pt2_model, workdir, capsys):
    model, _, _ = pt2_model
    lib = workdir / "tiny_dump.so"
    argv = ["compile", str(model), "--dump-code", "relax,tir,ll,asm", "-o", str(lib)]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "wrote tiny_dump.so.relax, tiny_dump.so.tir, tiny_dump.so.ll, tiny_dump.so.asm" in out
    relax_text = (workdir / "tiny_dump.so.relax").read_text()
    assert "R.function" in relax_text and "roi_align" in relax_text
    assert 'layout="NHWC"' in relax_text  # ConvertLayout ran before the dump
    tir_text = (workdir / "tiny_dump.so.tir").read_text()
    assert "T.prim_func" in tir_text and "roi_align" in tir_text
    assert "define" in (workdir / "tiny_dump.so.ll").read_text()
    assert ".text" in (workdir / "tiny_dump.so.asm").read_text()


def test_compile_cross_target_to_tar(pt2_model, workdir, capsys):
    """aarch64 builds here (LLVM cross) and exports as .tar; running it here is refused."""
    model, inputs, _ = pt2_model
    lib = workdir / "tiny_aarch64.tar"
    code, out, err = run_cli(
        ["compile", str(model), "--target", "llvm -mtriple=aarch64-linux-gnu", "-o", str(lib)], capsys
    )
    assert code == 0, err
    assert lib.is_file() and "layout NHWC" in out
    for extra in ([], ["--device", "cpu"]):
        code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), *extra], capsys)
        assert code == 1
        one_line_error(err, "cross target")


def test_tvm_warnings_shown_once_or_hidden_with_quiet(gather_model, workdir, capfd):
    lib = str(workdir / "gather.so")
    assert cli.main(["compile", str(gather_model), "-o", lib]) == 0
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "Fast mode segfaults" in line]
    assert len(lines) == 1, err  # each distinct line once, however often TVM printed it
    assert cli.main(["compile", str(gather_model), "-o", lib, "-q"]) == 0
    captured = capfd.readouterr()
    assert captured.err == "", captured.err
    assert "compiled" in captured.out


def test_compile_errors(pt2_model, onnx_model, workdir, capfd):
    model, _, _ = pt2_model
    onnx_path, _, _ = onnx_model
    out = str(workdir / "never.so")
    garbage = workdir / "garbage.pt2"
    garbage.write_bytes(b"this is not a zip archive")
    bad_onnx = workdir / "garbage.onnx"
    bad_onnx.write_bytes(b"\x00\x01not protobuf at all\xff" * 3)
    cases = [
        (["compile", str(workdir / "missing.pt2"), "-o", out], ["does not exist"]),
        (["compile", str(garbage), "-o", out], ["cannot read", "torch.export.save"]),
        (["compile", str(bad_onnx), "-o", out], ["onnx"]),
        (
            ["compile", str(workdir / "tiny_in.npz"), "-o", out],
            ["unknown model format", ".pt2 or .onnx", "detector name", "maskrcnn_resnet50_fpn"],
        ),
        (
            ["compile", str(model), "--tuning-records", str(workdir / "no_records"), "-o", out],
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
        (["compile", str(model), "-o", str(workdir / "lib.txt")], [".so"]),
        (["compile", str(model), "-o", str(workdir / "no_such_dir" / "m.so")], ["folder", "does not exist"]),
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
        code = cli.main(["-q", *argv])
        err = capfd.readouterr().err
        assert code == 1, (argv, err)
        one_line_error(err, *words)
    assert not (workdir / "never.so").exists()
    assert not (workdir / "no_such_dir").exists()
    # without -q too, a missing model file is one line: no progress line before it
    code = cli.main(["compile", str(workdir / "missing.pt2"), "-o", out])
    assert code == 1
    one_line_error(capfd.readouterr().err, "does not exist")


def test_compile_detector_weights_errors(workdir, capsys):
    """--weights of a detector name that is not its state_dict: one line naming --weights (the
    torchvision model is built, nothing is compiled)."""
    garbage = workdir / "garbage.pth"
    garbage.write_bytes(b"not a torch file")
    a_list = workdir / "list.pth"
    torch.save([torch.zeros(2)], a_list)
    other = workdir / "linear.pth"
    torch.save(torch.nn.Linear(2, 2).state_dict(), other)
    out = str(workdir / "never_det.so")
    name = "fasterrcnn_mobilenet_v3_large_fpn"
    cases = [
        (garbage, ["not a PyTorch file written by torch.save"]),
        (a_list, ["holds a list, not a state_dict"]),
        (other, [f"not a {name} state_dict", "missing", "unexpected"]),
        (workdir / "nothing.pth", ["does not exist"]),
    ]
    for weights, words in cases:
        code, _, err = run_cli(["compile", name, "--weights", str(weights), "-o", out], capsys)
        assert code == 1, (weights, err)
        one_line_error(err, "--weights", *words)
    assert not (workdir / "never_det.so").exists()


def test_missing_package_names_the_pip_package():
    assert "'pillow' (module 'PIL')" in cli.missing_package("run", "PIL")
    assert "pip install pillow" in cli.missing_package("run", "PIL")
    assert "'scikit-image' (module 'skimage')" in cli.missing_package("maskrcnn", "skimage")
    assert 'pip install "tvm-roialign[cli]"' in cli.missing_package("maskrcnn", "skimage.data")
    assert 'pip install "tvm-roialign[onnx]"' in cli.missing_package("compile", "onnx")
    assert 'pip install "tvm-roialign[tune]"' in cli.missing_package("tune", "xgboost")
    assert 'pip install "tvm-roialign[tune]"' in cli.missing_package("tune", "cloudpickle")


def test_symbolic_onnx_inputs_get_one_note(workdir, capsys):
    """An ONNX model with dynamic axes builds, with one note (not under -q) that the library runs at
    every size (--input-shapes for one), and one line saying which kernels the rules tiled."""
    path = _onnx_model(
        workdir / "dyn.onnx",
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
    )
    lib = str(workdir / "dyn.so")
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


def test_missing_optional_dependency_is_one_line(pt2_model, workdir, capsys, monkeypatch):
    """A core-only install (no torch) gets a one-line error naming the package, not a traceback."""
    model, _, _ = pt2_model
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ModuleNotFoundError
    code, _, err = run_cli(["compile", str(model), "-o", str(workdir / "never.so")], capsys)
    assert code == 1
    one_line_error(err, "needs the Python package 'torch'", "pip install")


# ---------------------------------------------------------------------------------------------
# run: timing, profile, top values, generated inputs, devices


def test_run_print_time(pt2_lib, pt2_model, capsys):
    _, inputs, _ = pt2_model
    code, out, err = run_cli(
        ["run", str(pt2_lib), "--inputs", str(inputs), "--print-time", "--repeat", "3", "--number", "2"],
        capsys,
    )
    assert code == 0, err
    assert "3 measurement(s) of 2 call(s), after a warm-up call" in out
    header, values = out.strip().splitlines()[-2:]
    assert header.split() == ["mean", "(ms)", "median", "(ms)", "max", "(ms)", "min", "(ms)", "std", "(ms)"]
    mean, median, largest, smallest, std = (float(v) for v in values.split())
    assert smallest <= median <= largest and smallest <= mean <= largest
    # the spread of 3 values in [smallest, largest] (population or sample std) is at most their range
    assert std <= (largest - smallest) + 1e-3


def test_run_profile(pt2_lib, pt2_model, capsys):
    _, inputs, _ = pt2_model
    code, out, err = run_cli(
        ["run", str(pt2_lib), "--inputs", str(inputs), "--profile", "--repeat", "2"], capsys
    )
    assert code == 0, err
    assert "Profile: per run, mean of 2 run(s)" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") >= 5}
    assert any("roi_align" in name for name in rows), out
    assert any("conv2d" in name for name in rows), out
    assert "vm.builtin.*" in rows


def test_run_print_top(pt2_lib, pt2_model, capsys):
    _, inputs, expected = pt2_model
    code, out, err = run_cli(["run", str(pt2_lib), "--inputs", str(inputs), "--print-top", "4"], capsys)
    assert code == 0, err
    assert f"top 4 of output 0 (row 0 of {list(expected.shape)})" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\S+$", line)]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4]
    assert [int(r[1]) for r in rows] == list(np.argsort(-expected[0].reshape(-1), kind="stable")[:4])


@pytest.mark.parametrize("mode", ["zeros", "ones", "random"])
def test_run_fill_mode(pt2_lib, workdir, capsys, mode):
    """Without --inputs, inputs are made from the shapes and dtypes compile recorded."""
    outputs = workdir / f"fill_{mode}.npz"
    code, _, err = run_cli(["run", str(pt2_lib), "--fill-mode", mode, "--outputs", str(outputs)], capsys)
    assert code == 0, err
    model = _TinyRoi().eval()
    if mode == "random":  # seeded: the same inputs every time
        again = workdir / "fill_random_again.npz"
        assert run_cli(["run", str(pt2_lib), "--outputs", str(again)], capsys)[0] == 0
        with np.load(outputs) as a, np.load(again) as b:
            np.testing.assert_array_equal(a["output_0"], b["output_0"])
        return
    if mode == "ones":  # every roi's batch index is 1, outside [0, 1): a row of zeros, by the op's contract
        with np.load(outputs) as result:
            assert result["output_0"].shape == (NUM_ROIS, 8, 7, 7) and not result["output_0"].any()
        return
    with torch.no_grad():
        expected = model(torch.zeros(1, 3, 32, 32), torch.zeros(NUM_ROIS, 5)).numpy()
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


def test_run_device(pt2_lib, pt2_model, capsys):
    _, inputs, _ = pt2_model
    code, out, err = run_cli(["run", str(pt2_lib), "--inputs", str(inputs), "--device", "cpu"], capsys)
    assert code == 0, err
    assert "on cpu" in out
    for device, words in (("gpu", ["--device", "unknown device 'gpu'"]), ("cuda", ["--device", "cuda"])):
        code, _, err = run_cli(["run", str(pt2_lib), "--inputs", str(inputs), "--device", device], capsys)
        assert code == 1
        one_line_error(err, *words)


# ---------------------------------------------------------------------------------------------
# run: matching inputs honestly, and its error messages


def test_run_extra_array_gets_one_note(pt2_lib, pt2_model, workdir, capsys):
    _, inputs, expected = pt2_model
    with np.load(inputs) as npz:
        arrays = dict(npz)
    extra = workdir / "extra.npz"
    np.savez(extra, **arrays, unused=np.zeros(3), spare=np.ones(2))
    outputs = workdir / "extra_out.npz"
    code, _, err = run_cli(["run", str(pt2_lib), "--inputs", str(extra), "--outputs", str(outputs)], capsys)
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "unused, spare" in notes[0], err
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


def test_run_by_order_only_when_asked(pt2_lib, pt2_model, workdir, capsys):
    _, inputs, expected = pt2_model
    with np.load(inputs) as npz:
        x, rois = npz["x"], npz["rois"]
    unnamed = workdir / "unnamed.npz"
    np.savez(unnamed, x, rois)  # arr_0, arr_1
    code, _, err = run_cli(["run", str(pt2_lib), "--inputs", str(unnamed)], capsys)
    assert code == 1
    one_line_error(
        err, "lacks x, rois", "the model takes x, rois", "the file has arr_0, arr_1", "--inputs-by-order"
    )
    outputs = workdir / "unnamed_out.npz"
    argv = ["run", str(pt2_lib), "--inputs", str(unnamed), "--inputs-by-order", "--outputs", str(outputs)]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


def test_run_library_without_metadata(pt2_lib, pt2_model, workdir, capsys):
    _, inputs, _ = pt2_model
    bare = workdir / "bare"
    bare.mkdir(exist_ok=True)
    lib = bare / "model.so"
    shutil.copy(pt2_lib, lib)
    code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs)], capsys)
    assert code == 1
    one_line_error(err, "no .json beside it", "--inputs-by-order")
    code, _, err = run_cli(["run", str(lib)], capsys)
    assert code == 1
    one_line_error(err, "give --inputs")
    code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), "--inputs-by-order"], capsys)
    assert code == 0, err


_CUSTOM_OP_PROGRAM = """
import sys, torch
@torch.library.custom_op("tvm_roialign_test_only::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2
@twice.register_fake
def _(x):
    return torch.empty_like(x)
class M(torch.nn.Module):
    def forward(self, x):
        return torch.ops.tvm_roialign_test_only.twice(x) + 1
torch.export.save(torch.export.export(M(), (torch.randn(2, 8),)), sys.argv[1])
"""


class _Rfft(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()


def test_import_errors_name_the_unsupported_or_unregistered_op(workdir, capsys):
    """An aten op the importer lacks, and a custom op not registered in this process (the program
    is written by another process, where the op exists): one line each, naming the op."""
    fft = workdir / "rfft.pt2"
    torch.export.save(torch.export.export(_Rfft(), (torch.randn(2, 8),)), str(fft))
    custom = workdir / "custom_op.pt2"
    subprocess.run([sys.executable, "-c", _CUSTOM_OP_PROGRAM, str(custom)], check=True, timeout=300)
    out = str(workdir / "never.so")
    code, _, err = run_cli(["compile", str(fft), "-o", out], capsys)
    assert code == 1
    one_line_error(err, "not supported by the torch.export importer", "aten._fft_r2c.default")
    code, _, err = run_cli(["compile", str(custom), "-o", out], capsys)
    assert code == 1
    one_line_error(err, "custom ops not registered", "tvm_roialign_test_only::twice")


def test_run_says_what_it_takes(pt2_model, workdir, capsys):
    model, inputs, _ = pt2_model
    code, _, err = run_cli(["run", str(model), "--inputs", str(inputs)], capsys)
    assert code == 1
    one_line_error(err, "run takes a library made by compile", "compile it first", model.name)
    script = workdir / "script.py"
    script.write_text("print(1)")
    code, _, err = run_cli(["run", str(script)], capsys)
    assert code == 1
    one_line_error(err, "run takes a library made by compile (.so or .tar)", "script.py")


def test_run_errors(pt2_lib, pt2_model, workdir, capsys):
    _, inputs, _ = pt2_model
    only_y = workdir / "only_y.npz"
    np.savez(only_y, y=np.zeros(3, "float32"))
    wrong_shape = workdir / "wrong_shape.npz"
    np.savez(wrong_shape, x=np.zeros((1, 3, 16, 16), "float32"), rois=_rois())
    wrong_dtype = workdir / "wrong_dtype.npz"
    np.savez(wrong_dtype, x=np.zeros((1, 3, 32, 32), "float64"), rois=_rois())
    text_file = workdir / "inputs.txt"
    text_file.write_text("hello")
    npy_file = workdir / "x.npy"
    np.save(npy_file, np.zeros(3))
    not_lib = workdir / "not_a_lib.so"
    not_lib.write_text("hello")
    lib = str(pt2_lib)
    cases = [
        (["run", str(workdir / "missing.so"), "--inputs", str(inputs)], ["does not exist"]),
        (["run", str(not_lib), "--inputs", str(inputs)], ["cannot load"]),
        (["run", lib, "--inputs", str(workdir / "none.npz")], ["--inputs", "does not exist"]),
        (["run", lib, "--inputs", str(text_file)], ["--inputs", "not an .npz archive", "numpy.savez"]),
        (["run", lib, "--inputs", str(npy_file)], ["--inputs", "a .npy array"]),
        (
            ["run", lib, "--inputs", str(only_y)],
            ["lacks x, rois", "the model takes x, rois", "the file has y"],
        ),
        (
            ["run", lib, "--inputs", str(wrong_shape)],
            ["--inputs: input 'x' has shape [1, 3, 16, 16]", "[1, 3, 32, 32]"],
        ),
        (
            ["run", lib, "--inputs", str(wrong_dtype)],
            ["--inputs: input 'x' has dtype float64", "float32"],
        ),
        (["run", lib, "--inputs", str(only_y), "--inputs-by-order"], ["has 1 arrays, the model takes 2"]),
        (
            ["run", lib, "--outputs", str(workdir / "nowhere" / "o.npz")],
            ["--outputs", "folder", "does not exist"],
        ),
        (["run", lib, "--outputs", str(workdir / "o.txt")], ["--outputs", ".npz"]),
        (["run", lib, "--repeat", "0"], ["--repeat must be at least 1"]),
        (["run", lib, "--number", "0"], ["--number must be at least 1"]),
        (["run", lib, "--print-top", "0"], ["--print-top must be at least 1"]),
    ]
    for argv, words in cases:
        code, _, err = run_cli(argv, capsys)
        assert code == 1, (argv, err)
        one_line_error(err, *words)
    assert not (workdir / "nowhere").exists()  # no folder is created silently


# ---------------------------------------------------------------------------------------------
# maskrcnn


def test_maskrcnn_reduced(workdir, capsys):
    """The main-job command on a reduced configuration: picture, report and agreement."""
    (workdir / "mask").mkdir()
    out = workdir / "mask" / "result.png"
    argv = ["maskrcnn", "--out", str(out), "--min-size", "128", "--proposals", "40", "--detections", "8"]
    code, stdout, err = run_cli([*argv, "--repeat", "1", "--check"], capsys)
    assert code == 0, err + stdout
    from PIL import Image

    with Image.open(out) as picture:
        assert picture.width == 512 and picture.height > 512  # the caption strip below the photo
    report = json.loads(out.with_suffix(".json").read_text())
    cmp = report["comparison"]
    assert cmp["passed"] and cmp["num_detections_tvm"] == cmp["num_detections_torch"] > 0
    assert cmp["same_labels"] and cmp["max_box_diff"] <= 1e-2 and cmp["mask_pixel_agreement"] >= 0.999
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


def test_maskrcnn_errors(workdir, capsys):
    not_image = workdir / "not_image.png"
    not_image.write_text("hello")
    other_model = workdir / "weights.pt"
    torch.save({"conv.weight": torch.zeros(1)}, other_model)
    text_weights = workdir / "weights.txt"
    text_weights.write_text("hello")
    tensor_weights = workdir / "tensor.pt"
    torch.save(torch.zeros(3), tensor_weights)
    out = str(workdir / "r.png")
    cases = [
        (["--image", str(workdir / "missing.jpg")], ["--image", "does not exist"]),
        (["--image", str(not_image)], ["--image", "not a readable image"]),
        (["--target", "tpu"], ["--target", "unknown target"]),
        (["--layout", "NWHC"], ["NCHW or NHWC"]),
        (["--weights", str(workdir / "missing.pth")], ["--weights", "does not exist"]),
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
        (str(workdir / "r.gif"), [".png"]),
        (str(workdir / "nowhere" / "r.png"), ["folder"]),
    ):
        code, _, err = run_cli(["maskrcnn", "--out", bad_out], capsys)
        assert code == 1
        one_line_error(err, "--out", *words)
    assert not (workdir / "nowhere").exists()


def test_maskrcnn_compile_only_cross_target(workdir, capsys):
    """--compile-only builds the three graphs for a target this machine cannot run (aarch64)."""
    out = workdir / "cross.png"
    argv = ["maskrcnn", "--target", "aarch64", "--compile-only", "--out", str(out)]
    code, stdout, err = run_cli([*argv, "--min-size", "64", "--proposals", "10", "--detections", "4"], capsys)
    assert code == 0, err + stdout
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["compile_only"] and report["config"]["target"]["mtriple"] == "aarch64-linux-gnu"
    assert set(report["pieces"]) == {"backbone", "box_branch", "mask_branch"}
    for counts in report["transposes"]["per_piece"].values():
        assert counts["adjacent_to_roi_align_after"] == 0
    assert not out.exists()


def test_detector_resize_bounds(monkeypatch, workdir, capsys):
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
            str(workdir / "never.so")]
    code, _, err = run_cli(argv, capsys)
    assert code == 1 and "stopped before the build" in err, err
    assert seen == {"bounds": ((800,), 1333), "padded": [(800, 1216), (1216, 800)]}
