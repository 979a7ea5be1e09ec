"""``tvm-roialign run``, in-process, on the tiny .pt2 model compiled once per session
(tests/conftest.py's ``pt2_lib``): timing, profile, top values, generated inputs, devices, how
inputs are matched, every error path. No test times anything; timing flags are checked for what
they print.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _cli import one_line_error, run_cli
from _cli_models import NUM_ROIS, TinyRoi, tiny_rois


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
def test_run_fill_mode(pt2_lib, cli_workdir, capsys, mode):
    """Without --inputs, inputs are made from the shapes and dtypes compile recorded."""
    outputs = cli_workdir / f"fill_{mode}.npz"
    code, _, err = run_cli(["run", str(pt2_lib), "--fill-mode", mode, "--outputs", str(outputs)], capsys)
    assert code == 0, err
    model = TinyRoi().eval()
    if mode == "random":  # seeded: the same inputs every time
        again = cli_workdir / "fill_random_again.npz"
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


def test_run_extra_array_gets_one_note(pt2_lib, pt2_model, cli_workdir, capsys):
    _, inputs, expected = pt2_model
    with np.load(inputs) as npz:
        arrays = dict(npz)
    extra = cli_workdir / "extra.npz"
    np.savez(extra, **arrays, unused=np.zeros(3), spare=np.ones(2))
    outputs = cli_workdir / "extra_out.npz"
    code, _, err = run_cli(["run", str(pt2_lib), "--inputs", str(extra), "--outputs", str(outputs)], capsys)
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "unused, spare" in notes[0], err
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


def test_run_by_order_only_when_asked(pt2_lib, pt2_model, cli_workdir, capsys):
    _, inputs, expected = pt2_model
    with np.load(inputs) as npz:
        x, rois = npz["x"], npz["rois"]
    unnamed = cli_workdir / "unnamed.npz"
    np.savez(unnamed, x, rois)  # arr_0, arr_1
    code, _, err = run_cli(["run", str(pt2_lib), "--inputs", str(unnamed)], capsys)
    assert code == 1
    one_line_error(
        err,
        f"--inputs {str(unnamed)!r} lacks x, rois",  # the file's path, as given
        "the model takes x, rois",
        "the file has arr_0, arr_1",
        "--inputs-by-order",
    )
    outputs = cli_workdir / "unnamed_out.npz"
    argv = ["run", str(pt2_lib), "--inputs", str(unnamed), "--inputs-by-order", "--outputs", str(outputs)]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)


def test_run_library_without_metadata(pt2_lib, pt2_model, cli_workdir, capsys):
    _, inputs, _ = pt2_model
    bare = cli_workdir / "bare"
    bare.mkdir(exist_ok=True)
    lib = bare / "model.so"
    shutil.copy(pt2_lib, lib)
    code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs)], capsys)
    assert code == 1
    one_line_error(err, "no metadata file", "--no-verify")
    code, _, err = run_cli(["run", str(lib), "--no-verify", "--inputs", str(inputs)], capsys)
    assert code == 1
    one_line_error(err, "no .json beside it", "--inputs-by-order")
    code, _, err = run_cli(["run", str(lib), "--no-verify"], capsys)
    assert code == 1
    one_line_error(err, "give --inputs")
    code, _, err = run_cli(
        ["run", str(lib), "--no-verify", "--inputs", str(inputs), "--inputs-by-order"], capsys
    )
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


def test_import_errors_name_the_unsupported_or_unregistered_op(cli_workdir, capsys):
    """An aten op the importer lacks, and a custom op not registered in this process (the program
    is written by another process, where the op exists): one line each, naming the op."""
    fft = cli_workdir / "rfft.pt2"
    torch.export.save(torch.export.export(_Rfft(), (torch.randn(2, 8),)), str(fft))
    custom = cli_workdir / "custom_op.pt2"
    subprocess.run([sys.executable, "-c", _CUSTOM_OP_PROGRAM, str(custom)], check=True, timeout=300)
    out = str(cli_workdir / "never.so")
    code, _, err = run_cli(["compile", str(fft), "-o", out], capsys)
    assert code == 1
    one_line_error(err, "not supported by the torch.export importer", "aten._fft_r2c.default")
    code, _, err = run_cli(["compile", str(custom), "-o", out], capsys)
    assert code == 1
    one_line_error(err, "custom ops not registered", "tvm_roialign_test_only::twice")


def test_run_says_what_it_takes(pt2_model, cli_workdir, capsys):
    model, inputs, _ = pt2_model
    code, _, err = run_cli(["run", str(model), "--inputs", str(inputs)], capsys)
    assert code == 1
    one_line_error(err, "run takes a library made by compile", "compile it first", model.name)
    script = cli_workdir / "script.py"
    script.write_text("print(1)")
    code, _, err = run_cli(["run", str(script)], capsys)
    assert code == 1
    one_line_error(err, "run takes a library made by compile (.so or .tar)", "script.py")


def test_run_errors(pt2_lib, pt2_model, cli_workdir, capsys):
    _, inputs, _ = pt2_model
    only_y = cli_workdir / "only_y.npz"
    np.savez(only_y, y=np.zeros(3, "float32"))
    wrong_shape = cli_workdir / "wrong_shape.npz"
    np.savez(wrong_shape, x=np.zeros((1, 3, 16, 16), "float32"), rois=tiny_rois())
    wrong_dtype = cli_workdir / "wrong_dtype.npz"
    np.savez(wrong_dtype, x=np.zeros((1, 3, 32, 32), "float64"), rois=tiny_rois())
    text_file = cli_workdir / "inputs.txt"
    text_file.write_text("hello")
    npy_file = cli_workdir / "x.npy"
    np.save(npy_file, np.zeros(3))
    not_lib = cli_workdir / "not_a_lib.so"
    not_lib.write_text("hello")
    lib = str(pt2_lib)
    cases = [
        (["run", str(cli_workdir / "missing.so"), "--inputs", str(inputs)], ["does not exist"]),
        (["run", str(not_lib), "--inputs", str(inputs)], ["has no metadata file", "--no-verify"]),
        (["run", str(not_lib), "--no-verify", "--inputs", str(inputs)], ["cannot load"]),
        (["run", lib, "--inputs", str(cli_workdir / "none.npz")], ["--inputs", "does not exist"]),
        (["run", lib, "--inputs", str(text_file)], ["--inputs", "not an .npz archive", "numpy.savez"]),
        (["run", lib, "--inputs", str(npy_file)], ["--inputs", "a .npy array"]),
        (
            ["run", lib, "--inputs", str(only_y)],
            [f"--inputs {str(only_y)!r} lacks x, rois", "the model takes x, rois", "the file has y"],
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
            ["run", lib, "--outputs", str(cli_workdir / "nowhere" / "o.npz")],
            ["--outputs", "folder", "does not exist"],
        ),
        (["run", lib, "--outputs", str(cli_workdir / "o.txt")], ["--outputs", ".npz"]),
        (["run", lib, "--repeat", "0"], ["--repeat must be at least 1"]),
        (["run", lib, "--number", "0"], ["--number must be at least 1"]),
        (["run", lib, "--print-top", "0"], ["--print-top must be at least 1"]),
    ]
    for argv, words in cases:
        code, _, err = run_cli(argv, capsys)
        assert code == 1, (argv, err)
        one_line_error(err, *words)
    assert not (cli_workdir / "nowhere").exists()  # no folder is created silently


def test_run_takes_an_onnx_models_own_input_names(cli_workdir, capsys):
    """TVM renames an ONNX input that is not an identifier (``input.1`` -> ``input_1``): ``run``
    takes arrays under the file's own name as well as under TVM's."""
    pytest.importorskip("onnx")
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    path, lib = cli_workdir / "dotted.onnx", cli_workdir / "dotted.so"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17, input_names=["input.1"])
    code, _, err = run_cli(["compile", str(path), "-o", str(lib)], capsys)
    assert code == 0, err
    for key in ("input.1", "input_1"):
        inputs, outputs = cli_workdir / "dotted_in.npz", cli_workdir / "dotted_out.npz"
        np.savez(inputs, **{key: x.numpy()})
        code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys)
        assert code == 0, (key, err)
        with np.load(outputs) as result:
            np.testing.assert_allclose(result["output_0"], model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_run_checks_a_symbolic_librarys_inputs(onnx_model, cli_workdir, capsys):
    """A library of symbolic shapes (the roi count ``N`` of rois [N, 4] and batch_indices [N]):
    ``run`` checks the rank, every static dimension and that ``N`` is one value across the inputs,
    in one line each (not TVM's match_cast text); inputs that fit run as onnxruntime does."""
    model, inputs, expected = onnx_model
    lib = cli_workdir / "tiny_symbolic.so"
    code, _, err = run_cli(["compile", str(model), "-o", str(lib)], capsys)
    assert code == 0, err
    with np.load(inputs) as npz:
        feeds = dict(npz)
    cases = {
        "rank": ({"rois": feeds["rois"][None]}, ["input 'rois' has shape [1, 6, 4] (rank 3)",
                                                 "expects [N, 4] (rank 2)"]),
        "static": ({"rois": feeds["rois"][:, :3]}, ["input 'rois' has shape [6, 3]", "[N, 4]"]),
        "bound": ({"batch_indices": feeds["batch_indices"][:4]},
                  ["input 'batch_indices' has N = 4", "input 'rois' axis 0 has N = 6"]),
    }
    for case, (changed, words) in cases.items():
        path = cli_workdir / f"symbolic_{case}.npz"
        np.savez(path, **{**feeds, **changed})
        code, _, err = run_cli(["run", str(lib), "--inputs", str(path)], capsys)
        assert code == 1, (case, err)
        one_line_error(err, "--inputs:", *words)
        assert "match_cast" not in err
    outputs = cli_workdir / "tiny_symbolic_out.npz"
    code, _, err = run_cli(["run", str(lib), "--inputs", str(inputs), "--outputs", str(outputs)], capsys)
    assert code == 0, err
    with np.load(outputs) as result:
        np.testing.assert_allclose(result["output_0"], expected, rtol=1e-4, atol=1e-4)
