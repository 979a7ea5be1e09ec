"""The command line called in-process, and the check every error path of it must pass."""

from __future__ import annotations

from tvm_roialign import cli


def run_cli(argv, capsys, quiet=True):
    """``tvm-roialign ARGV`` in this process (with ``--quiet`` unless told): (exit code, stdout, stderr)."""
    code = cli.main(["--quiet", *argv] if quiet else list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str, *words):
    """``err`` is one line, ``tvm-roialign: error: ...``, naming every one of ``words``."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("tvm-roialign: error: "), err
    for word in words:
        assert word.lower() in lines[0].lower(), (word, lines[0])
