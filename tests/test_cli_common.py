"""The ``tvm-roialign`` command line's parser, in-process: version, help defaults, global options,
usage errors, ``python -m tvm_roialign``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tvm_roialign import cli


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
