"""The ``tvm-roialign`` command line's parser, in-process: version, help defaults, global options,
usage errors, ``python -m tvm_roialign``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tvm_roialign import cli


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert re.match(r"tvm-roialign \d+\.\d+\.\d+ \(Apache TVM .+\)", out), out
    import tvm  # the version read from TVM's distribution is the one imported

    assert f"(Apache TVM {tvm.__version__})" in out, out


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
    assert all(hasattr(module, "add_arguments") for module in cli.SUBCOMMANDS)


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


@pytest.mark.parametrize(
    "argv, code",
    [(["--help"], 0), (["--version"], 0), (["compile", "--help"], 0), (["compile"], 2),
     (["run", "x.so", "--fill-mode", "twos"], 2)],
)
@pytest.mark.parametrize("entry", ["-m", "script"])
def test_help_version_and_usage_errors_import_neither_tvm_nor_torch(argv, code, entry):
    """Importing TVM takes seconds: ``--help``, ``--version`` and usage errors import neither TVM
    nor torch (``-X importtime`` lists every module the process imported), through ``python -m`` and
    through a ``tvm-roialign`` script like the one pip writes."""
    if entry == "-m":
        command = [sys.executable, "-X", "importtime", "-m", "tvm_roialign", *argv]
    else:
        script = Path(tempfile.mkdtemp()) / "tvm-roialign"
        script.write_text("import sys\nfrom tvm_roialign.cli import main\nsys.exit(main())\n")
        command = [sys.executable, "-X", "importtime", str(script), *argv]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == code, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "tvm_roialign.cli" in imported
    assert not {"tvm", "torch"} & imported, sorted({"tvm", "torch"} & imported)
