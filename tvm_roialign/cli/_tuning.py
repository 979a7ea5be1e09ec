"""``--tuning-records DIR`` for the subcommands that build (``compile``, ``maskrcnn``)."""

from __future__ import annotations

from ._common import CLIError

HELP_RECORDS = (
    "a tuning database written by 'tvm-roialign tune -o DIR': a task gets its record where tune's "
    "check found it faster than the default rules, every other task the default rules (a line says "
    "how many of each)"
)


def add_records_argument(parser) -> None:
    parser.add_argument("--tuning-records", default=None, metavar="DIR", help=HELP_RECORDS)


def open_records(directory: str | None, target, report=None):
    """The :class:`~tvm_roialign.tuning.TuningRecords` of ``--tuning-records`` (None without it).
    ``report`` receives the coverage of each build (default: a warning when some tasks had no
    record); ``pipeline.build`` also returns it, which ``compile`` prints."""
    if not directory:
        return None
    from pathlib import Path

    from ..tuning import TuningRecordsMismatch, load_records

    if not Path(directory).is_dir():
        what = "is a file, not a directory" if Path(directory).exists() else "does not exist"
        raise CLIError(f"--tuning-records: the directory {directory!r} {what}")
    try:
        return load_records(directory, target, report=report)
    except (FileNotFoundError, TuningRecordsMismatch, ValueError) as err:
        raise CLIError(f"--tuning-records: {err}") from None


def print_coverage(coverages) -> None:
    """One line per build: how many of its tunable tasks had records."""
    for coverage in coverages:
        print(coverage)


__all__ = ["HELP_RECORDS", "add_records_argument", "open_records", "print_coverage"]
