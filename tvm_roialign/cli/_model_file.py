"""Model files for ``compile``: ``.pt2`` (``torch.export.save``) and ``.onnx``, and input shapes.

:func:`parse_input_shapes` reads tvmc's ``--input-shapes "x:[1,3,224,224] rois:[6,5]"`` and the
older ``--input-shape x:1,3,224,224``; :func:`load_model` imports a file with tvm-roialign's importers.
"""

from __future__ import annotations

import logging
import re
import zipfile
from pathlib import Path

from ._common import CLIError, first_line

PT2_SUFFIXES = (".pt2", ".pt", ".ep")

_TVMC_SHAPE = re.compile(r"\s*([^\s:\[\]]+(?::[^\s:\[\]]+)*)\s*:\s*\[([^\]]*)\]\s*,?")


def _dims(text: str, item: str, flag: str, form: str) -> list[int]:
    try:
        dims = [int(d) for d in text.replace(" ", "").split(",") if d != ""]
    except ValueError:
        raise CLIError(f"{flag} {item!r}: dimensions must be integers, e.g. {form}") from None
    if not dims or any(d <= 0 for d in dims):
        raise CLIError(f"{flag} {item!r}: dimensions must be positive integers, e.g. {form}")
    return dims


def parse_input_shapes(tvmc_text: str | None, items: list[str] | None) -> dict[str, list[int]]:
    """``{name: shape}`` from ``--input-shapes`` (tvmc: ``"x:[1,3,224,224] y:[2]"``) and the
    repeatable ``--input-shape x:1,3,224,224``."""
    shapes: dict[str, list[int]] = {}
    if tvmc_text:
        form = '"x:[1,3,224,224] rois:[6,5]"'
        pos = 0
        text = tvmc_text.strip()
        while pos < len(text):
            match = _TVMC_SHAPE.match(text, pos)
            if match is None:
                raise CLIError(f"--input-shapes {tvmc_text!r} must look like {form}")
            shapes[match.group(1)] = _dims(match.group(2), tvmc_text, "--input-shapes", form)
            pos = match.end()
    for item in items or []:
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise CLIError(f"--input-shape {item!r} must look like NAME:1,3,224,224")
        shapes[name] = _dims(dims.strip("[]"), item, "--input-shape", "NAME:1,3,224,224")
    return shapes


_OP_TARGET = re.compile(r'"target"\s*:\s*"torch\.ops\.([A-Za-z_][\w]*)\.([A-Za-z_][\w]*)(?:\.[\w]+)?"')
_BUILTIN_NAMESPACES = {"aten", "prims", "higher_order", "_ops"}


def unregistered_custom_ops(path: Path) -> list[str]:
    """``["NAMESPACE::NAME", ...]``: the custom ops a ``.pt2`` archive's graphs call that are not
    registered in this process (torch.export.load would fail on them with no useful message)."""
    import torch

    try:
        import torchvision  # noqa: F401 - registers torchvision:: ops
    except ImportError:
        pass
    seen: set[tuple[str, str]] = set()
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if "/models/" in name and name.endswith(".json"):
                text = archive.read(name).decode("utf-8", errors="replace")
                seen.update(_OP_TARGET.findall(text))
    missing = []
    for namespace, op in sorted(seen):
        if namespace in _BUILTIN_NAMESPACES:
            continue
        try:
            getattr(getattr(torch.ops, namespace), op)
        except (AttributeError, RuntimeError):
            missing.append(f"{namespace}::{op}")
    return missing


def _load_pt2(path: Path, shapes: dict):
    import torch

    from ..frontend import from_exported_program
    from ..frontend.torch import UnsupportedOperators

    if shapes:
        raise CLIError(
            f"{str(path)!r} is a torch.export program, which fixes its own input shapes; "
            "--input-shapes is for ONNX models"
        )
    if not zipfile.is_zipfile(path):
        raise CLIError(
            f"cannot read {str(path)!r} as a torch.export program (.pt2): not a zip archive "
            "(write it with torch.export.save)"
        )
    unregistered = unregistered_custom_ops(path)
    if unregistered:
        raise CLIError(
            f"cannot read {str(path)!r}: it calls custom ops not registered in this process: "
            f"{', '.join(unregistered)} (register them with torch.library before loading it; "
            "from Python: import the module that defines them, then tvm_roialign.frontend)"
        )
    logger = logging.getLogger("torch.export")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # torch logs a traceback before raising
    try:
        exported = torch.export.load(str(path))
    except Exception as err:  # noqa: BLE001
        raise CLIError(
            f"cannot read {str(path)!r} as a torch.export program (.pt2): {first_line(err)}"
        ) from None
    finally:
        logger.setLevel(level)
    try:
        return from_exported_program(exported, keep_params_as_input=False)
    except UnsupportedOperators as err:
        raise CLIError(f"cannot import {str(path)!r}: {err}") from None


def _load_onnx(path: Path, shapes: dict):
    import onnx

    from ..frontend import from_onnx

    try:
        model = onnx.load(str(path))
    except Exception as err:  # noqa: BLE001
        raise CLIError(f"cannot read {str(path)!r} as an ONNX model: {first_line(err)}") from None
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    unknown = [name for name in shapes if name not in inputs]
    if unknown:
        raise CLIError(
            f"--input-shapes names {', '.join(unknown)}, but the inputs of {path.name} are "
            f"{', '.join(inputs) or 'none'}"
        )
    try:
        mod = from_onnx(model, shape_dict=shapes or None)
    except Exception as err:  # noqa: BLE001 - the importer raises many kinds
        raise CLIError(f"cannot import {str(path)!r} into TVM: {first_line(err)}") from None
    # TVM renames inputs that are not identifiers (``input.1`` -> ``input_1``): the file's own
    # names go into the library's .json too, where ``run --inputs`` finds them
    main = mod["main"]
    if len(main.params) == len(inputs):
        mod["main"] = main.with_attr(SOURCE_NAMES_ATTR, inputs)
    return mod


#: the function attribute holding the model file's input names, in the parameters' order
SOURCE_NAMES_ATTR = "tvm_roialign.source_input_names"


MODEL_SUFFIXES = (*PT2_SUFFIXES, ".onnx")


#: What ``compile`` writes: a shared library or TVM's ``export_library`` tar.
LIBRARY_SUFFIXES = (".so", ".tar", ".dylib")


def check_library_file(path: Path) -> None:
    """That ``path`` is a library made by ``compile`` (one line naming ``run``'s input otherwise)."""
    if not path.exists():
        raise CLIError(f"compiled library {str(path)!r} does not exist")
    if not path.is_file():
        raise CLIError(f"compiled library {str(path)!r} is a folder, not a library file")
    if path.suffix.lower() in MODEL_SUFFIXES:
        raise CLIError(
            f"run takes a library made by compile (.so or .tar), and {str(path)!r} is a model "
            f"file: compile it first, e.g. tvm-roialign compile {path} -o {path.stem}.so"
        )
    if path.suffix.lower() not in LIBRARY_SUFFIXES:
        raise CLIError(
            f"run takes a library made by compile (.so or .tar), got {str(path)!r}"
        )


def check_model_file(path: Path, alternatives: str = "") -> None:
    """That ``path`` exists and is a .pt2 or .onnx, before any work starts (``alternatives``: the
    other kinds of MODEL the subcommand takes, for the message)."""
    if path.suffix.lower() not in MODEL_SUFFIXES:
        raise CLIError(
            f"unknown model format {path.suffix.lower() or '(no suffix)'!r} for {str(path)!r}: "
            f"expected .pt2 or .onnx{alternatives}"
        )
    if not path.is_file():
        raise CLIError(f"model file {str(path)!r} does not exist")


def symbolic_inputs_note(path: Path, mod) -> str | None:
    """A ``note:`` line when inputs of ``mod`` have symbolic dimensions (ONNX dynamic axes): the
    library runs at every size, ``--input-shapes`` builds a faster one for one size (the build's
    'symbolic shapes' line says which kernels fell back); None when all are static."""
    dynamic = [s for s in signature(mod) if s["shape"] and any(isinstance(d, str) for d in s["shape"])]
    if not dynamic:
        return None
    listed = ", ".join(f"{s['name']} [{', '.join(str(d) for d in s['shape'])}]" for s in dynamic)
    example = " ".join(
        f"{s['name']}:[{','.join(str(_example_dim(i, d)) for i, d in enumerate(s['shape']))}]"
        for s in dynamic
    )
    return (
        f"note: {path.name} has inputs with symbolic dimensions: {listed}; the library runs at "
        f"every size, but kernels the rules cannot tile at a symbolic size (the 'symbolic shapes' "
        f'line after the build) run slower than at one static size: --input-shapes "{example}"'
    )


def check_int8_calibration(path: Path, mod) -> None:
    """Before the build: ``--precision int8`` of a model file calibrates on photos, which needs
    ``main`` to take one float32 image batch of static size; a one-line error otherwise, naming
    ``--input-shapes`` where static shapes would do (an ONNX model's dynamic batch or size)."""
    from ..precision.calibration import image_layout

    if image_layout(mod) is not None:
        return
    inputs = signature(mod)
    takes = ", ".join(
        f"{s['name']} {s['dtype']} [{', '.join(str(d) for d in s['shape'] or ['?'])}]" for s in inputs
    )
    needs = (
        f"--precision int8 calibrates on photos, which needs a model of one float32 image input "
        f"[N, 3, H, W] or [N, H, W, 3] of static size; {path.name} takes {takes}"
    )
    shape = inputs[0]["shape"] if len(inputs) == 1 else None
    if shape and len(shape) == 4 and any(isinstance(d, str) for d in shape):
        example = f"{inputs[0]['name']}:[{','.join(str(_example_dim(i, d)) for i, d in enumerate(shape))}]"
        needs += f': give it a static shape, e.g. --input-shapes "{example}"'
    raise CLIError(needs)


def _example_dim(index: int, dim) -> int:
    if isinstance(dim, int):
        return dim
    return 1 if index == 0 else 224


def load_model(path: Path, shapes: dict | None = None):
    """Import ``path`` (.pt2 or .onnx) into a Relax IRModule with tvm-roialign's importers."""
    check_model_file(path)
    suffix = path.suffix.lower()
    if suffix in PT2_SUFFIXES:
        return _load_pt2(path, shapes or {})
    return _load_onnx(path, shapes or {})


def signature(mod) -> list[dict]:
    """``[{"name", "shape", "dtype"}]`` of ``main``'s parameters (symbolic dims as text), with
    ``source_name`` where the model file names the input otherwise (ONNX names TVM renamed)."""
    from tvm import relax

    params = []
    sources = (mod["main"].attrs or {}).get(SOURCE_NAMES_ATTR) if mod["main"].attrs else None
    for index, var in enumerate(mod["main"].params):
        ty = var.ty
        shape = None
        if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
            shape = [int(v) if hasattr(v, "value") else str(v) for v in ty.shape.values]
        dtype = str(ty.dtype) if isinstance(ty, relax.TensorType) else None
        params.append({"name": var.name, "shape": shape, "dtype": dtype})
        if sources is not None and str(sources[index]) != var.name:
            params[-1]["source_name"] = str(sources[index])
    return params
