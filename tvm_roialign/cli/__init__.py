"""``tvm-roialign``: a tvmc-style command line (tvmc itself no longer ships with TVM).

Subcommands, one module each (:data:`SUBCOMMANDS`; a module has ``HELP``, ``DESCRIPTION``,
``add_arguments(parser)`` and ``main(args)``, which :func:`._common.add_command` makes a parser of):

``compile MODEL -o OUT.so`` (:mod:`.compile`)
    Import a ``.pt2`` or ``.onnx`` model, ConvertLayout it (NHWC on CPU targets unless told
    otherwise), build it for ``--target`` (default: this machine's CPU) and export the library.
``run OUT.so`` (:mod:`.run`)
    Run it on inputs from an ``.npz`` (or generated ones); ``--print-time``, ``--profile``,
    ``--print-top``.
``maskrcnn`` (:mod:`.maskrcnn`)
    torchvision's Mask R-CNN through TVM on a photo, compared with PyTorch eager.
``tune MODEL|maskrcnn -o DIR`` (:mod:`.tune`)
    MetaSchedule over the conv/matmul tasks into a tuning database (resumable, local or through
    an RPC tracker); ``compile`` and ``maskrcnn`` apply it with ``--tuning-records DIR``.

Global options (``-q``) are accepted before or after the subcommand. Every failure the user can
cause exits with status 1 (2 for command-line syntax) and one line ``tvm-roialign: error: ...``.
"""

from __future__ import annotations

import argparse
import sys

from ..host import use_usable_cores
from . import compile as compile_command
from . import maskrcnn as maskrcnn_command
from . import run as run_command
from . import tune as tune_command
from ._common import CLIError, add_command, seconds_since_process_start

#: The subcommand modules, in the order ``--help`` lists them.
SUBCOMMANDS = [compile_command, run_command, maskrcnn_command, tune_command]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults in the help, except for options whose default is "not given" or whose
    help names its default itself."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or action.help is None:
            return action.help
        if "default" in action.help:  # the help says it already
            return action.help
        return super()._get_help_string(action)


class _SubcommandParser(argparse.ArgumentParser):
    """The subcommands' parsers: defaults shown in their help too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def _global_options(suppress_defaults: bool) -> argparse.ArgumentParser:
    # the subparsers' copy must not set a default, or it would undo `-q` given before the command
    default = argparse.SUPPRESS if suppress_defaults else False
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="no progress display and no TVM warnings",
    )
    return parent


def _version() -> str:
    """The versions, TVM's from its installed distribution's metadata (importing TVM takes seconds;
    a TVM built from source, with no distribution, is imported)."""
    from importlib import metadata

    from .._version import __version__

    distributions = metadata.packages_distributions().get("tvm") or []
    try:
        tvm_version = metadata.version(distributions[0])
    except (IndexError, metadata.PackageNotFoundError):
        import tvm

        tvm_version = tvm.__version__
    return f"tvm-roialign {__version__} (Apache TVM {tvm_version})"


#: Python module -> (pip package, the tvm-roialign extra that installs it or None).
OPTIONAL_PACKAGES = {
    "torch": ("torch", "torch"),
    "torchvision": ("torchvision", "torch"),
    "onnx": ("onnx", "onnx"),
    "onnxruntime": ("onnxruntime", "onnx"),
    "skimage": ("scikit-image", "cli"),
    "PIL": ("pillow", None),  # a core dependency: only a broken install lacks it
    "matplotlib": ("matplotlib", "bench"),
    "xgboost": ("xgboost", "tune"),
    "psutil": ("psutil", "tune"),
    "tornado": ("tornado", "tune"),
    "cloudpickle": ("cloudpickle", "tune"),
    "rich": ("rich", None),
}


def missing_package(command: str, module: str | None) -> str:
    """The error for ``command`` failing to import ``module``: the pip package that provides it."""
    top = (module or "").split(".")[0]
    package, extra = OPTIONAL_PACKAGES.get(top, (top, None))
    how = f'pip install "tvm-roialign[{extra}]"' if extra else f"pip install {package}"
    module_text = f" (module {top!r})" if top != package else ""
    return f"{command} needs the Python package {package!r}{module_text}; install it: {how}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvm-roialign",
        description="Compile and run models with tvm-roialign's RoIAlign (a tvmc-style CLI).",
        parents=[_global_options(False)],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_SubcommandParser
    )
    parents = [_global_options(True)]
    for module in SUBCOMMANDS:
        add_command(sub, parents, module)
    return parser


def main(argv=None) -> int:
    """The command line; ``argv`` None reads ``sys.argv`` (and counts the process's startup time)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from .. import _api  # noqa: F401 - TVM and the registration, once the arguments parse
    # Python's and TVM's start (importing TVM takes seconds: it imports torch), which the
    # subcommand's own clock, started next, does not see
    args.startup_s = seconds_since_process_start() if argv is None else None
    try:
        use_usable_cores()  # before the first TVM kernel (a compile's constant folding runs some)
        return args.func(args)
    except CLIError as err:
        print(f"tvm-roialign: error: {err}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as err:  # an optional dependency of this subcommand
        print(f"tvm-roialign: error: {missing_package(args.command, err.name)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tvm-roialign: interrupted", file=sys.stderr)
        return 130


__all__ = ["SUBCOMMANDS", "CLIError", "build_parser", "main", "missing_package"]
