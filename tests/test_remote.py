"""``run --rpc`` against an x86 RPC server on loopback (what a board runs), and how ``compile``
names a cross library (a ``.so`` where the cross linker is installed, a ``.tar`` with a note
otherwise). Fast, no board: the board itself is tests/test_board.py's."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _cli import one_line_error, run_cli
from _targets import CLI_AARCH64, CLI_NATIVE

from tvm_roialign import linking


class _Tiny(torch.nn.Module):
    """conv 3x3 + ReLU, a dense layer, and a second output (a tuple over RPC)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc(y.flatten(1)), y.mean()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("remote")


@pytest.fixture(scope="module")
def model(workdir):
    """(model.pt2, inputs.npz, eager outputs)."""
    module = _Tiny().eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype("float32"))
    torch.export.save(torch.export.export(module, (x,)), str(workdir / "tiny.pt2"))
    np.savez(workdir / "in.npz", x=x.numpy())
    with torch.no_grad():
        expected = [t.numpy() for t in module(x)]
    return workdir / "tiny.pt2", workdir / "in.npz", expected


def test_run_rpc_outputs_time_and_profile_on_the_server(model, workdir, capsys, tol, rpc_server):
    path, inputs, expected = model
    server = rpc_server()  # python -m tvm.exec.rpc_server on loopback: its address
    lib = workdir / "tiny.so"
    assert run_cli(["compile", str(path), "-o", str(lib)], capsys)[0] == 0
    out_npz = workdir / "out.npz"
    argv = ["run", str(lib), "--rpc", server, "--inputs", str(inputs), "--outputs", str(out_npz)]
    code, out, err = run_cli([*argv, "--print-time", "--profile", "--repeat", "2"], capsys)
    assert code == 0, err
    assert f"on the remote cpu:0 of {server}" in out
    assert "Execution time summary (2 measurement(s)" in out
    assert "fused_conv2d" in out and "RPC round trips" in out  # the per-kernel table, remote
    with np.load(out_npz) as got:  # a tuple of outputs came back (through get_outputs)
        for i, want in enumerate(expected):
            np.testing.assert_allclose(got[f"output_{i}"], want, rtol=tol["float32"], atol=tol["float32"])


def test_rpc_errors_are_one_line(model, workdir, capsys, rpc_server):
    path, inputs, _ = model
    lib = workdir / "tiny_err.so"
    assert run_cli(["compile", str(path), "-o", str(lib)], capsys)[0] == 0
    cases = [
        (["--rpc", "nohost"], ["--rpc", "HOST:PORT"]),
        (["--rpc", f"127.0.0.1:{rpc_server.free_port()}"], ["cannot reach the RPC server"]),
        (["--rpc-key", "k"], ["--rpc-key", "--rpc-tracker"]),
        (["--rpc-tracker", "127.0.0.1:9"], ["--rpc-key"]),
        (["--rpc", "127.0.0.1:1", "--rpc-tracker", "127.0.0.1:2", "--rpc-key", "k"], ["not both"]),
    ]
    for extra, words in cases:
        code, _out, err = run_cli(["run", str(lib), "--inputs", str(inputs), *extra], capsys)
        assert code == 1, (extra, err)
        one_line_error(err, *words)


AARCH64 = CLI_AARCH64


def test_cross_library_names(tmp_path, monkeypatch):
    """A .so of a cross target: kept where the cross linker is installed, else a .tar (noted)."""
    monkeypatch.setattr(linking, "cross_linker", lambda triple: "/usr/bin/aarch64-linux-gnu-gcc")
    path, note = linking.choose_library(tmp_path / "m.so", AARCH64)
    assert path == tmp_path / "m.so" and "cross-linked m.so for aarch64-linux-gnu" in note
    monkeypatch.setattr(linking, "cross_linker", lambda triple: None)
    path, note = linking.choose_library(tmp_path / "m.so", AARCH64)
    assert path == tmp_path / "m.tar"
    assert "no cross linker for aarch64-linux-gnu" in note and "gcc-aarch64-linux-gnu" in note
    with pytest.raises(ValueError, match=r"no cross linker.*export a \.tar instead"):
        linking.export_options(AARCH64, tmp_path / "m.so")
    # not cross, or not a .so: as asked, no note
    assert linking.choose_library(tmp_path / "m.so", CLI_NATIVE) == (tmp_path / "m.so", None)
    assert linking.choose_library(tmp_path / "m.tar", AARCH64) == (tmp_path / "m.tar", None)


def test_compile_cross_so_or_tar(model, workdir, capsys, monkeypatch):
    path, _, _ = model
    lib = workdir / "arm.so"
    if linking.cross_linker("aarch64-linux-gnu"):
        code, _, err = run_cli(["compile", str(path), "--target", "aarch64", "-o", str(lib)], capsys,
                               quiet=False)
        assert code == 0, err
        assert "note: cross-linked arm.so for aarch64-linux-gnu" in err
        header = lib.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    monkeypatch.setattr(linking, "cross_linker", lambda triple: None)
    code, _, err = run_cli(["compile", str(path), "--target", "aarch64", "-o",
                            str(workdir / "arm2.so")], capsys, quiet=False)
    assert code == 0, err
    assert "wrote arm2.tar (object files) instead of arm2.so" in err
    assert (workdir / "arm2.tar").is_file() and (workdir / "arm2.tar.json").is_file()
    assert not (workdir / "arm2.so").exists()
