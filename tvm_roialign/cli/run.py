"""``tvm-roialign run LIB``: run a compiled library on inputs, time it, profile it (as ``tvmc run``).

Inputs come from an ``.npz`` (``--inputs``), matched to the model's inputs by name (the names
``compile`` recorded in ``LIB.json``), or by position with ``--inputs-by-order``; without
``--inputs`` they are generated (``--fill-mode``). Outputs go to ``--outputs`` as ``output_0``,
``output_1``, ...
"""

from __future__ import annotations

import sys
import time
import zipfile
from pathlib import Path

from . import _detector
from ._common import CLIError, first_line, output_path
from ._model_file import LIBRARY_SUFFIXES, check_library_file

FILL_MODES = ("random", "zeros", "ones")


HELP = "run a compiled library; time (--print-time) or profile (--profile) it"

DESCRIPTION = (
    "Run a library written by `compile` on inputs from an .npz (matched by name), or generated ones "
    "(--fill-mode); time it (--print-time, after a warm-up call), profile it per kernel (--profile), "
    "print a classifier's top values (--print-top); with --rpc or --rpc-tracker, on a remote device. "
    "A detector library (compile DETECTOR) runs on photos (--image PHOTO [PHOTO ...]). The library "
    "is checked against the size and sha256 that compile recorded in LIB.json before it is loaded "
    "(--no-verify to skip)."
)


def add_arguments(p) -> None:
    """The options of `run` (its parser: :func:`._common.add_command`)."""
    p.add_argument(
        "library",
        nargs="?",
        help="a library written by `compile` (LIB.json beside it names the inputs)",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="load the library without comparing it with the size and sha256 that compile "
        "recorded in LIB.json (for a library built elsewhere, or a LIB.json without them)",
    )
    p.add_argument("--inputs", default=None, help=".npz with one array per model input, by name")
    p.add_argument(
        "--inputs-by-order",
        action="store_true",
        help="match the arrays of --inputs to the model's inputs by position, not name",
    )
    p.add_argument(
        "--fill-mode",
        choices=FILL_MODES,
        default="random",
        help="inputs without --inputs: uniform [0, 1) floats (integers 0), zeros or ones",
    )
    p.add_argument("--outputs", default=None, help=".npz to write (output_0, output_1, ...)")
    p.add_argument("--device", default=None, help="cpu, cuda, metal... (:INDEX); default: the build's")
    p.add_argument(
        "--print-time",
        action="store_true",
        help="time the model: mean/median/max/min/std over --repeat x --number calls after a warm-up "
        "(a detector: the artifact with its NumPy pre- and post-processing, one call = all photos)",
    )
    p.add_argument("--repeat", type=int, default=1, help="measurements for --print-time and --profile")
    p.add_argument("--number", type=int, default=1, help="calls per measurement (their mean is one result)")
    p.add_argument("--profile", action="store_true", help="time every kernel, averaged over --repeat runs")
    p.add_argument(
        "--print-top",
        type=int,
        default=None,
        metavar="N",
        help="the N largest values of output 0 (classifiers)",
    )
    _add_rpc_arguments(p)
    _detector.add_run_arguments(p)


def _add_rpc_arguments(p) -> None:
    group = p.add_argument_group(
        "remote device (TVM RPC, as tvmc): the library is uploaded and runs there; --print-time, "
        "--profile and --outputs measure and fetch from it"
    )
    group.add_argument(
        "--rpc", default=None, metavar="HOST:PORT", help="an RPC server (python -m tvm.exec.rpc_server)"
    )
    group.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT", help="an RPC tracker")
    group.add_argument("--rpc-key", default=None, help="the key of the tracker's device to run on")


def _remote(args):
    """The RPC session of ``--rpc`` / ``--rpc-tracker --rpc-key`` (None without them)."""
    if args.rpc is None and args.rpc_tracker is None:
        if args.rpc_key is not None:
            raise CLIError("--rpc-key needs --rpc-tracker HOST:PORT")
        return None
    if args.rpc is not None and args.rpc_tracker is not None:
        raise CLIError("give --rpc HOST:PORT or --rpc-tracker HOST:PORT --rpc-key KEY, not both")
    from .. import remote

    try:
        return remote.connect(args.rpc, args.rpc_tracker, args.rpc_key)
    except ValueError as err:
        raise CLIError(str(err)) from None


def _read_npz(text: str) -> dict:
    import numpy as np

    path = Path(text)
    if not path.is_file():
        raise CLIError(f"--inputs {text!r} does not exist")
    how = "write one with numpy.savez(path, NAME=array, ...)"
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as fh:
            magic = fh.read(6)
        if magic == b"\x93NUMPY":
            raise CLIError(f"--inputs {text!r} is a .npy array, not an .npz archive of named arrays ({how})")
        raise CLIError(f"--inputs {text!r} is not an .npz archive ({how})")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except Exception as err:  # noqa: BLE001
        raise CLIError(f"--inputs {text!r} is not a readable .npz ({how}): {first_line(err)}") from None


def _match(arrays: dict, specs: list | None, by_order: bool, source: str):
    """The arrays in the model's input order, and the names of those left over."""
    names = [s["name"] for s in specs] if specs else None
    if by_order:
        if names is not None and len(arrays) < len(names):
            raise CLIError(
                f"--inputs {source!r} has {len(arrays)} arrays, the model takes {len(names)} "
                f"({', '.join(names)})"
            )
        count = len(names) if names is not None else len(arrays)
        return list(arrays.values())[:count], list(arrays)[count:]
    if names is None:
        raise CLIError(
            "the library has no .json beside it, so its input names are unknown; "
            "add --inputs-by-order to pass the arrays in file order"
        )
    # an input also found under the model file's own name (an ONNX name TVM renamed)
    arrays = dict(arrays)
    for spec in specs:
        own_name = spec.get("source_name")
        if own_name in arrays and spec["name"] not in arrays:
            arrays[spec["name"]] = arrays.pop(own_name)
    missing = [n for n in names if n not in arrays]
    if missing:
        hint = " (add --inputs-by-order to match by position)" if len(arrays) >= len(names) else ""
        raise CLIError(
            f"--inputs {source!r} lacks {', '.join(missing)}: the model takes {', '.join(names)}; "
            f"the file has {', '.join(arrays) or 'no arrays'}{hint}"
        )
    return [arrays[n] for n in names], [k for k in arrays if k not in names]


def _check(specs, arrays) -> None:
    """The arrays of ``--inputs`` against the shapes and dtypes ``compile`` recorded: the rank,
    every static dimension, and each symbolic dimension (a name such as ``N``) one value across
    the inputs, as the library's ``match_cast`` needs (one line instead of TVM's check text)."""
    bound: dict = {}  # symbolic dimension -> (its value, the input and axis that set it)
    for spec, array in zip(specs or [], arrays):
        if spec.get("shape") is not None:
            _check_shape(spec["name"], spec["shape"], list(array.shape), bound)
        if spec.get("dtype") and str(array.dtype) != spec["dtype"]:
            raise CLIError(
                f"--inputs: input {spec['name']!r} has dtype {array.dtype}, the model expects "
                f"{spec['dtype']}"
            )


def _check_shape(name: str, expected: list, shape: list, bound: dict) -> None:
    """``shape`` of input ``name`` against ``expected`` (ints and symbolic names, as recorded)."""
    wanted = f"[{', '.join(str(d) for d in expected)}]"
    if len(shape) != len(expected):
        raise CLIError(
            f"--inputs: input {name!r} has shape {shape} (rank {len(shape)}), the model expects "
            f"{wanted} (rank {len(expected)})"
        )
    for axis, (dim, size) in enumerate(zip(expected, shape)):
        if isinstance(dim, int) and size != dim:
            raise CLIError(f"--inputs: input {name!r} has shape {shape}, the model expects {wanted}")
        if isinstance(dim, str) and dim.isidentifier():
            value, where = bound.setdefault(dim, (size, f"input {name!r} axis {axis}"))
            if value != size:
                raise CLIError(
                    f"--inputs: input {name!r} has {dim} = {size} (axis {axis}, shape {shape}), but "
                    f"{where} has {dim} = {value}: the model expects {wanted}, one {dim} for all"
                )


def _fill(specs, mode: str, library: str) -> list:
    import numpy as np

    if not specs:
        raise CLIError(
            f"{library!r} has no .json beside it, so its inputs are unknown; give --inputs"
        )
    rng = np.random.default_rng(0)
    arrays = []
    for spec in specs:
        shape, dtype = spec.get("shape"), spec.get("dtype")
        if not shape or not all(isinstance(d, int) for d in shape) or not dtype:
            raise CLIError(f"input {spec['name']!r} has the symbolic shape {shape}; give --inputs")
        if mode == "zeros":
            arrays.append(np.zeros(shape, dtype))
        elif mode == "ones":
            arrays.append(np.ones(shape, dtype))
        elif np.issubdtype(np.dtype(dtype), np.floating):
            arrays.append(rng.random(shape).astype(dtype))
        else:  # integers index things: 0 is always in range
            arrays.append(np.zeros(shape, dtype))
    return arrays


def _flatten(result) -> list:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    out = []
    for item in result:
        out.extend(_flatten(item))
    return out


def _load(args, meta: dict, session=None):
    """``(library path, metadata, device, VM, remote library or None)`` of the library that
    :func:`checked_metadata` has checked (``meta``); with an RPC ``session``, on its device."""
    import tvm

    from ..host import request_amx
    from ..runtime.loaded_vm import LoadedVM
    from ..target import device_for, parse_device, parse_target

    lib_path = Path(args.library)
    if session is not None:
        return (lib_path, meta, *_load_remote(args, session, lib_path, meta))
    try:
        target = parse_target(meta["target"]) if "target" in meta else None
        if args.device is not None:
            device = parse_device(args.device, target)
        else:
            device = device_for(target) if target is not None else tvm.cpu()
    except ValueError as err:
        raise CLIError(f"--device: {err}" if args.device is not None else str(err)) from None
    try:
        request_amx(required="amx" in (meta.get("bf16_kernels"), meta.get("int8_kernels")))
    except RuntimeError as err:
        raise CLIError(str(err)) from None
    try:
        vm = LoadedVM(tvm.runtime.load_module(str(lib_path)), device)
    except Exception as err:  # noqa: BLE001
        raise CLIError(f"cannot load {str(lib_path)!r} as a compiled model: {_load_error(err)}") from None
    return lib_path, meta, device, vm, None


def _load_error(err) -> str:
    """Why TVM could not load a library, in the dynamic loader's own words where it is the loader
    that refused (TVM's message repeats the path and its internal check)."""
    text = first_line(err)
    if "Failed to load dynamic shared library" in text:
        return f"not a shared library this machine can load ({text.rsplit(': ', 1)[-1]})"
    return text


def _load_remote(args, session, lib_path, meta):
    """``(device, VM, library module)`` of the library uploaded to the RPC ``session``."""
    from .. import remote
    from ..target import parse_device, parse_target

    try:
        target = parse_target(meta["target"]) if "target" in meta else None
        local = parse_device(args.device, target) if args.device is not None else None
        device = remote.remote_device(session, local)
    except ValueError as err:
        raise CLIError(f"--device: {err}") from None
    if lib_path.suffix != ".so":
        raise CLIError(
            f"{lib_path.name}: a remote device loads a .so; compile with -o NAME.so where the "
            "target's cross linker is installed"
        )
    from ..runtime.loaded_vm import LoadedVM

    try:
        module = remote.load_library(session, lib_path)
        return device, LoadedVM(module, device), module
    except Exception as err:  # noqa: BLE001
        raise CLIError(f"cannot load {lib_path.name} on the remote device: {first_line(err)}") from None


def _call(vm, inputs, stateful: bool):
    if stateful:
        from ..remote import run_vm

        return _flatten(run_vm(vm, inputs))
    return _flatten(vm["main"](*inputs))


def checked_metadata(args) -> dict:
    """``LIB.json`` of the library, after checking the library against it (unless
    ``--no-verify``): :func:`tvm_roialign.runtime.artifact_check.check_library`."""
    from ..runtime.artifact_check import check_library

    try:
        return check_library(args.library, not args.no_verify, "--no-verify")
    except (ValueError, FileNotFoundError) as err:
        raise CLIError(first_line(err)) from None


def _missing_library(args) -> str:
    """Why the library argument is absent: ``--image`` took it as a photo, or it was not given."""
    last = args.image[-1] if args.image else None
    if last is not None and Path(last).suffix.lower() in LIBRARY_SUFFIXES:
        return (
            f"--image read {last!r} as a photo and no library is left: give the library first, "
            f"e.g. run {last} --image {' '.join(args.image[:-1])}"
        )
    return "run needs the library to run: run LIB.so [options]"


def main(args) -> int:
    import numpy as np
    import tvm

    if args.library is None:  # command-line syntax: status 2, as argparse's own errors
        print(f"tvm-roialign: error: {_missing_library(args)}", file=sys.stderr)
        return 2
    check_library_file(Path(args.library))
    meta = checked_metadata(args)
    for flag in ("repeat", "number"):
        if getattr(args, flag) < 1:
            raise CLIError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.image is not None or meta.get("kind") == "detector":
        if args.image is None:
            raise CLIError(
                f"{args.library!r} is a detector library: it runs on a photo, give --image PHOTO"
            )
        return _detector.run_main(args, _remote(args))
    if args.print_top is not None and args.print_top < 1:
        raise CLIError(f"--print-top must be at least 1, got {args.print_top}")
    out_path = output_path(args.outputs, "--outputs", (".npz",)) if args.outputs else None
    session = _remote(args)
    lib_path, meta, device, vm, remote_lib = _load(args, meta, session)
    specs = meta.get("inputs")
    if args.inputs is not None:
        arrays, ignored = _match(_read_npz(args.inputs), specs, args.inputs_by_order, args.inputs)
        if ignored:
            print(
                f"note: ignored arrays of {args.inputs} that the model does not take: {', '.join(ignored)}",
                file=sys.stderr,
            )
        _check(specs, arrays)
    else:
        arrays = _fill(specs, args.fill_mode, args.library)
    inputs = [tvm.runtime.tensor(np.ascontiguousarray(a), device) for a in arrays]
    try:
        t0 = time.perf_counter()
        outputs = _call(vm, inputs, session is not None)
        first_s = time.perf_counter() - t0
    except Exception as err:  # noqa: BLE001
        raise CLIError(f"running {lib_path.name} failed: {first_line(err)}") from None
    if out_path is not None:
        np.savez(out_path, **{f"output_{i}": o for i, o in enumerate(outputs)})
    shapes = ", ".join(str(list(o.shape)) for o in outputs)
    where = f" -> {out_path}" if out_path is not None else ""
    hint = "" if args.print_time else "; --print-time for steady-state timing"
    on = str(device)
    if session is not None:
        server = args.rpc or f"{args.rpc_key}@{args.rpc_tracker}"
        on = f"the remote {on.rsplit(']:', 1)[-1]} of {server}"
    print(
        f"ran {lib_path.name} on {on}: {len(outputs)} output(s) {shapes}{where} "
        f"(first call {first_s * 1e3:.1f} ms, includes one-time setup{hint})"
    )
    from . import _report

    if args.print_top is not None:
        _report.print_top(outputs[0], args.print_top)
    if args.print_time:
        from ..profiling import time_vm

        _report.print_time(
            time_vm(vm, device, inputs, args.number, args.repeat, stateful=session is not None)
        )
    if args.profile and session is not None:
        _profile_remote(args, meta, device, vm, remote_lib, inputs)
    elif args.profile:
        from ..profiling import profile_vm
        from ..runtime.loaded_vm import LoadedVM

        profiler = LoadedVM(tvm.runtime.load_module(str(lib_path)), device)
        _report.print_profile(*profile_vm(profiler, device, inputs, args.repeat), args.repeat)
    return 0


def _profile_remote(args, meta, device, vm, module, inputs) -> None:
    """``--profile`` on a remote device: each kernel timed there on its own (the signatures
    ``compile`` recorded), and the whole run for the wall time."""
    from ..profiling import profile_kernels, time_vm
    from . import _report

    kernels = meta.get("kernels")
    if not kernels:
        raise CLIError(
            f"--profile with --rpc needs the kernels' signatures in {args.library}.json "
            "(written by this version's compile): compile the model again"
        )
    wall = time_vm(vm, device, inputs, 1, args.repeat, stateful=True).mean_s
    try:
        times, round_trip = profile_kernels(module, device, kernels, args.repeat)
    except Exception as err:  # noqa: BLE001
        raise CLIError(f"--profile on the remote device failed: {first_line(err)}") from None
    print(
        "(remote: each kernel called on its own on inputs of its shapes, the fastest of --repeat "
        f"calls timed here less two RPC round trips of {round_trip * 1e6:.0f} us; VM builtins not "
        "included)"
    )
    _report.print_profile(times, wall, args.repeat)
