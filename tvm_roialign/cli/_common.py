"""What the subcommands share: the user-error exception and the mapping of library errors to it.

Library functions raise ``ValueError`` (or ``FileNotFoundError``) with messages that name the
value, not a flag; here each gets the flag it came from.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path


class CLIError(Exception):
    """A user error: printed as one line ``tvm-roialign: error: ...``, exit status 1."""


def seconds_since_process_start() -> float | None:
    """How long this process has run (Linux: /proc), or None where that is unknown."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def first_line(err) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def add_total(times: dict, t_start: float, startup_s: float | None) -> dict:
    """``times`` with ``total_s`` (since ``t_start``) and, on a real command line, the process's
    startup before main() (Python and TVM starting) first and in the total."""
    times = {**times, "total_s": time.perf_counter() - t_start}
    if startup_s is not None:
        times = {"startup_s": startup_s, **times}
        times["total_s"] += startup_s
    return times


def size_text(size: int) -> str:
    """A file's size as a summary line states it: ``"181.6 MB"``, ``"12 kB"``."""
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{max(1, round(size / 1e3))} kB"


def format_times(times: dict) -> str:
    """``"52.0 s (startup 1.2 s, import 3.4 s, ...)"``: the total and each stage."""
    stages = ", ".join(
        f"{name[:-2].replace('_', ' ')} {seconds:.1f} s"
        for name, seconds in times.items()
        if name != "total_s"
    )
    return f"{times['total_s']:.1f} s ({stages})"


def resolve_target(text, flag: str = "--target"):
    """:func:`tvm_roialign.target.parse_target`, a ``ValueError`` becoming a CLIError naming ``flag``."""
    from ..target import parse_target

    try:
        return parse_target(text)
    except ValueError as err:
        raise CLIError(f"{flag}: {err}") from None


def device_for(target):
    """:func:`tvm_roialign.target.device_for`, a ``ValueError`` becoming a CLIError."""
    from ..target import device_for as _device_for

    try:
        return _device_for(target)
    except ValueError as err:
        raise CLIError(str(err)) from None


def add_command(subparsers, parents, module) -> None:
    """The parser of the subcommand ``module`` (named as the module): the shared options of
    ``parents``, its ``HELP`` (a line of ``tvm-roialign --help``) and ``DESCRIPTION``, its own
    options (``module.add_arguments``), and ``module.main`` to run."""
    parser = subparsers.add_parser(
        module.__name__.rsplit(".", 1)[-1],
        parents=parents,
        help=module.HELP,
        description=module.DESCRIPTION,
    )
    module.add_arguments(parser)
    parser.set_defaults(func=module.main)


def output_path(text: str, flag: str, suffixes: tuple[str, ...] | None = None) -> Path:
    """``text`` as a file to write: its folder must exist (none is created), its suffix one of
    ``suffixes``."""
    path = Path(text)
    if suffixes and path.suffix.lower() not in suffixes:
        raise CLIError(f"{flag} {text!r}: the file must end in {' or '.join(suffixes)}")
    folder = path.parent
    if not folder.is_dir():
        raise CLIError(f"{flag} {text!r}: the folder {str(folder)!r} does not exist")
    return path


@contextlib.contextmanager
def tvm_messages(quiet: bool):
    """What TVM prints while the block runs: hidden with ``quiet``, else each line once.

    TVM's C++ code writes warnings straight to file descriptor 2 (ONNX models with a Gather print
    "Fast mode segfaults when there are out-of-bounds indices..." once per kernel), and its Python
    code uses ``warnings``. Both are collected during the block; afterwards, unless ``quiet``, each
    distinct line is printed once to stderr (with a repeat count). Python's ``sys.stderr`` (the
    progress display) keeps writing to the terminal meanwhile.
    """
    sys.stderr.flush()
    try:
        real_fd = sys.__stderr__.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (embedded): nothing to catch
        yield
        return
    saved = os.dup(real_fd)
    swapped = None
    try:
        if getattr(sys.stderr, "fileno", None) and _fileno(sys.stderr) == real_fd:
            swapped, sys.stderr = sys.stderr, os.fdopen(os.dup(saved), "w", buffering=1)
        with tempfile.TemporaryFile() as sink, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            os.dup2(sink.fileno(), real_fd)
            try:
                yield
            finally:
                os.dup2(saved, real_fd)
                sink.seek(0)
                native = sink.read().decode(errors="replace")
    finally:
        if swapped is not None:
            sys.stderr.close()
            sys.stderr = swapped
        os.close(saved)
    if not quiet:
        lines = [_TIMESTAMP.sub("", line).strip() for line in native.splitlines()]
        lines += [f"warning: {w.message}" for w in caught]
        counts = collections.Counter(line for line in lines if line)
        for line, count in counts.items():
            print(line + (f" (x{count})" if count > 1 else ""), file=sys.stderr)


_TIMESTAMP = re.compile(r"^\[\d\d:\d\d:\d\d\]\s*")


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None
