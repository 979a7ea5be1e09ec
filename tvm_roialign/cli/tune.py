"""``tvm-roialign tune MODEL|maskrcnn -o DIR``: MetaSchedule over a model's conv/matmul tasks (as
``tvmc tune``), into a tuning database that ``compile`` / ``maskrcnn --tuning-records DIR`` apply.

MODEL is a ``.pt2`` / ``.onnx`` file, imported and converted as ``compile`` does it (same options),
or ``maskrcnn``: the three static graphs of ``tvm-roialign maskrcnn`` (same options), tuned
together. The tasks are those of the build pipeline (so the records match what ``compile``
builds); ``--trials`` counts per task, records already in DIR included, so running the command
again resumes an interrupted run and a larger ``--trials`` goes on. With ``--rpc-tracker`` the
candidates are measured on the devices registered at a TVM RPC tracker (``python -m
tvm.exec.rpc_tracker``; devices run ``python -m tvm.exec.rpc_server --tracker HOST:PORT --key
KEY``), so a board or a farm tunes for its own ``--target``.
"""

from __future__ import annotations

import time
from pathlib import Path

from ._common import CLIError, first_line, resolve_target
from ._detector import build_fast
from ._progress import progress_session
from .compile import HELP_TARGET, add_model_arguments, import_model, model_options
from .maskrcnn import add_model_arguments as add_maskrcnn_arguments
from .maskrcnn import check_layout, model_inputs

MASKRCNN = "maskrcnn"

#: Trials per task below which `tune` warns that MetaSchedule's first, random samples rarely beat
#: the default rules (docs/tuning.md).
TRIALS_TO_EXPECT_A_GAIN = 64

HELP = "tune a model's conv/matmul kernels with MetaSchedule into a tuning database"

DESCRIPTION = (
    "Tune the conv2d/matmul kernels of a .pt2 / .onnx model (or of the Mask R-CNN pieces built for "
    "the photo's padded size: MODEL = maskrcnn) with MetaSchedule, into a tuning database directory "
    "for compile / maskrcnn --tuning-records. Kernels of symbolic shape are listed, not tuned. "
    "Resumable: --trials counts the records already there."
)


def add_arguments(p) -> None:
    """The options of `tune` (its parser: :func:`._common.add_command`)."""
    p.add_argument("model", help="a .pt2 / .onnx model, or 'maskrcnn' for the Mask R-CNN pieces")
    p.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="the tuning database directory (required, except with --tasks list)",
    )
    p.add_argument("--target", default="native", help=HELP_TARGET + "; llvm targets only")
    p.add_argument("--trials", type=int, default=64, help="trials per task, records in DIR included")
    p.add_argument(
        "--trials-global",
        type=int,
        default=None,
        metavar="N",
        help="at most N trials in this run (default: what the tasks still need)",
    )
    p.add_argument(
        "--ops",
        default="conv2d,matmul",
        help="tune the tasks whose fused name contains one of these (comma-separated; 'all': every task)",
    )
    p.add_argument(
        "--tasks",
        default="all",
        metavar="LIST",
        help="which of the tasks to tune, as tvmc tune: 'list' prints them (index, calls, MFLOP) and "
        "exits, '0,3,5-7' tunes those, 'all' every one",
    )
    p.add_argument(
        "--rpc-tracker", default=None, metavar="HOST:PORT", help="measure through a TVM RPC tracker"
    )
    p.add_argument("--rpc-key", default=None, metavar="KEY", help="the devices' key at --rpc-tracker")
    p.add_argument("--search-seed", type=int, default=None, help="seed of the search (default: random)")
    p.add_argument("-v", "--verbose", action="store_true", help="MetaSchedule's log on stdout too")
    add_model_arguments(p.add_argument_group("model files (as compile)"))
    add_maskrcnn_arguments(p.add_argument_group("Mask R-CNN (MODEL = maskrcnn, as the maskrcnn command)"))


def _ops(text: str) -> tuple:
    ops = tuple(o.strip() for o in text.split(",") if o.strip())
    if not ops:
        raise CLIError("--ops: give comma-separated op names (conv2d,matmul) or 'all'")
    return () if ops == ("all",) else ops


def _tasks(text: str):
    """``--tasks``: None (all), "list", or the indices given ('0,3,5-7')."""
    text = text.strip()
    if text in ("all", "list"):
        return None if text == "all" else text
    indices = []
    for part in (p.strip() for p in text.split(",")):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise CLIError(f"--tasks: expected 'list', 'all' or indices like 0,3,5-7, got {text!r}")
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo:
            raise CLIError(f"--tasks: the range {part!r} is empty")
        indices += range(lo, hi + 1)
    return indices


def _list_tasks(mods, target, ops, options) -> None:
    """One line per task (the task's name last, never cut): what ``--tasks`` takes."""
    from ..target import describe
    from ..tuning import extract_tasks
    from ..tuning.tasks import flops

    found = extract_tasks(mods, target, ops, **options)
    print(f"{len(found.tasks)} tuning tasks ({describe(target)}); tune --tasks takes the indices")
    print(f"{'index':>5}  {'calls':>5}  {'MFLOP per call':>14}  {'MFLOP in all':>12}  task")
    for i, task in enumerate(found.tasks):
        f = flops(task)
        each = "-" if f is None else f"{f / 1e6:.3g}"
        total = "-" if f is None else f"{f * task.weight / 1e6:.3g}"
        print(f"{i:>5}  {task.weight:>5}  {each:>14}  {total:>12}  {task.name}")
    if found.symbolic:
        print(f"not tunable: {len(found.symbolic)} tasks with symbolic shapes")


def _runner(args):
    if not args.rpc_tracker and not args.rpc_key:
        return "local"
    if not (args.rpc_tracker and args.rpc_key):
        raise CLIError("--rpc-tracker and --rpc-key go together")
    from ..tuning import rpc_runner

    try:
        return rpc_runner(args.rpc_tracker, args.rpc_key)
    except ValueError as err:
        raise CLIError(f"--rpc-tracker: {err}") from None


def _modules(args, target, progress) -> tuple[list, dict]:
    """The modules to tune, and phases 1-3's options as their build runs them: the layout is
    converted here (as compile and maskrcnn build), the Mask R-CNN pieces' convs are the
    detectors' (:func:`~tvm_roialign.models.detection.graph_options`)."""
    if args.model == MASKRCNN:
        from ..models import maskrcnn as mr
        from ..models.detection import graph_options

        check_layout(args)
        image, _config, model = model_inputs(args, mr)
        # tuned for the photo's padded size: the static build's tasks (what the records serve)
        detector = mr.TVMMaskRCNN(model, target, args.layout, progress, shapes="static")
        pieces = detector.relax_modules(detector.padded_shape(image))
        return [mod for _imported, mod, _s in pieces.values()], {
            "layout": None,
            **graph_options(model, build_fast(args)),
        }
    mod, _layout = import_model(args, model_options(args, target), progress, {})
    return [mod], {"layout": None}


def main(args) -> int:
    from ..target import describe
    from ..tuning import (
        MissingTuningDependency,
        TuningRecordsMismatch,
        check_target,
        close_runner,
        require_dependencies,
        tune,
    )

    try:
        target = check_target(resolve_target(args.target))
    except ValueError as err:
        raise CLIError(f"--target: {err}") from None
    if args.trials < 1:
        raise CLIError(f"--trials must be at least 1, got {args.trials}")
    if args.trials_global is not None and args.trials_global < 1:
        raise CLIError(f"--trials-global must be at least 1, got {args.trials_global}")
    ops = _ops(args.ops)
    selected = _tasks(args.tasks)
    if selected == "list":
        with progress_session(args.quiet) as progress:
            mods, options = _modules(args, target, progress)
        _list_tasks(mods, target, ops, options)
        return 0
    if not args.output:
        raise CLIError("-o DIR is required: the tuning database directory")
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise CLIError(f"-o {args.output!r} exists and is not a directory")
    try:
        require_dependencies()
    except MissingTuningDependency as err:
        raise CLIError(str(err)) from None
    runner = _runner(args)
    t0 = time.perf_counter()
    with progress_session(args.quiet) as progress:
        if args.trials < TRIALS_TO_EXPECT_A_GAIN:
            progress.note(
                f"warning: {args.trials} trials per task are too few to expect a gain: below about "
                f"{TRIALS_TO_EXPECT_A_GAIN} the default rules stay faster for most of the convs and "
                "matmuls they tile (kernels they leave to the fallback, such as grouped convs, gain "
                "sooner; compile applies a record only where it beat them)"
            )
        mods, options = _modules(args, target, progress)
        progress(f"tune for {describe(target)} into {out}")
        try:
            result = tune(
                mods,
                target,
                out,
                trials_per_task=args.trials,
                max_trials_global=args.trials_global,
                ops=ops,
                tasks=selected,
                runner=runner,
                seed=args.search_seed,
                progress=progress,
                verbose=args.verbose,
                **options,
            )
        except TuningRecordsMismatch as err:
            raise CLIError(f"-o: {err}") from None
        except ValueError as err:
            raise CLIError(str(err)) from None
        except Exception as err:  # noqa: BLE001 - MetaSchedule raises many kinds
            raise CLIError(f"tuning failed: {first_line(err)}") from None
        finally:
            if runner != "local":
                close_runner(runner)  # its measurement workers end with the command
    _print_result(result, describe(target), time.perf_counter() - t0)
    return 0


def _checked(check) -> str:
    """The interleaved check of a record: "record / default" ms (- if none was made)."""
    if not check:
        return "-"
    return f"{_ms(check['record_s'])} / {_ms(check['default_s'])}"


def _ms(seconds: float | None) -> str:
    """Milliseconds to four significant digits (a kernel of a few microseconds stays readable)."""
    return "-" if seconds is None else f"{seconds * 1e3:.4g}"


def _print_result(result, target_text: str, seconds: float) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..tuning.baseline import beats

    table = Table(title=f"tuning records in {result.work_dir} ({target_text})")
    for name in ("task", "calls", "trials", "best ms", "default rules ms", "checked ms", "applied"):
        # a task's name is never cut: it is what --tasks lists and the logs are named after
        table.add_column(name, justify="left" if name == "task" else "right", overflow="fold")
    applied = 0
    for task in sorted(result.tasks, key=lambda t: (-t["trials"], t["name"])):
        best, default = task["best_s"], task.get("default_s")
        baseline = None if default is None else {"default_s": default, "check": task.get("check")}
        wins = beats(best, baseline)
        applied += wins
        table.add_row(
            task["name"],
            str(task["weight"]),
            f"{task['trials_before']} -> {task['trials']}",
            _ms(best),
            _ms(default),
            _checked(task.get("check")),
            "yes" if wins else "no",
        )
    console = Console()
    if not console.is_terminal:  # a log or a pipe: one row per task, as wide as its name needs
        console.width = max(console.width, 100 + max((len(t["name"]) for t in result.tasks), default=0))
    console.print(table)
    print(
        f"{applied} of {len(result.tasks)} tasks beat the default rules' schedule (measured on the same "
        "runner): compile --tuning-records applies those records only"
    )
    per_trial = f" ({result.search_s / result.trials_run:.1f} s per trial)" if result.trials_run else ""
    print(
        f"{result.trials_run} trials run in {result.search_s:.0f} s{per_trial}; "
        f"{seconds:.0f} s in all with import and task extraction"
    )
    if result.symbolic:
        print(
            f"not tuned: {len(result.symbolic)} tasks with symbolic shapes "
            f"({', '.join(result.symbolic[:3])}{', ...' if len(result.symbolic) > 3 else ''})"
        )
