"""Exporting a build as a library: a ``.so`` linked here, a cross ``.so`` linked with the target
triple's cross linker (Debian's ``gcc-<arch>-linux-gnu``), or a ``.tar`` of object files.

One place for every exporter (``compile`` of a model file or a detector,
:meth:`tvm_roialign.models.detection.DetectorArtifact.export`): :func:`choose_library` picks what
to write for a requested path (a ``.so`` of a cross target becomes a ``.tar`` where no cross
linker is installed, with a note saying so), :func:`export_library` writes it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .host import is_host_triple

#: Cross linkers (Debian's ``gcc-<triple>``) for a ``.so`` of a cross target, by architecture.
CROSS_LINKERS = {"aarch64": "aarch64-linux-gnu-gcc", "arm64": "aarch64-linux-gnu-gcc"}


def _triple(target) -> str:
    """The ``mtriple`` of a Target or of a target's JSON dict ("" when it has none)."""
    if isinstance(target, dict):
        return str(target.get("mtriple", "") or "")
    kind = getattr(getattr(target, "kind", None), "name", "llvm")
    return str(target.attrs.get("mtriple", "") or "") if kind == "llvm" else ""


def cross_triple(target) -> str | None:
    """The target's triple when it is an llvm target for another architecture than this machine's."""
    triple = _triple(target)
    return None if is_host_triple(triple) else triple


def cross_linker(triple: str) -> str | None:
    """The path of the cross linker for ``triple`` (None: not installed)."""
    arch = triple.split("-")[0]
    return shutil.which(CROSS_LINKERS.get(arch, f"{arch}-linux-gnu-gcc"))


def _install_hint(triple: str) -> str:
    arch = triple.split("-")[0].replace("arm64", "aarch64")
    return f"Debian: apt-get install gcc-{arch}-linux-gnu"


def choose_library(path, target) -> tuple[Path, str | None]:
    """What to write for the requested ``path``: ``(path, note)``. A ``.so`` of a cross target
    stays a ``.so`` where the cross linker is installed (note: which linker) and becomes a
    ``.tar`` otherwise (note: why, and how to get a ``.so``); other paths are kept, without note."""
    path = Path(path)
    triple = cross_triple(target)
    if path.suffix != ".so" or triple is None:
        return path, None
    linker = cross_linker(triple)
    if linker is not None:
        return path, f"cross-linked {path.name} for {triple} with {linker}"
    tar = path.with_suffix(".tar")
    return tar, (
        f"no cross linker for {triple} on this machine ({_install_hint(triple)}): wrote {tar.name} "
        f"(object files) instead of {path.name}"
    )


def export_options(target, path) -> dict:
    """``export_library`` options for ``path``: the cross linker for a ``.so`` of a cross target
    (ValueError when it is not installed: write a ``.tar`` instead); nothing otherwise."""
    path = Path(path)
    triple = cross_triple(target)
    if path.suffix != ".so" or triple is None:
        return {}
    linker = cross_linker(triple)
    if linker is None:
        raise ValueError(
            f"no cross linker for {triple} on this machine ({_install_hint(triple)}); "
            "export a .tar instead"
        )
    from tvm.support import cc

    return {"fcompile": cc.cross_compiler(linker)}


def export_library(executable, path, target) -> Path:
    """``executable.export_library(path)``, cross-linked where ``target`` needs it; returns ``path``.
    A build whose kernels are in several LLVM modules (:func:`tvm_roialign.codegen.build_kernels`)
    has their objects written at once (:func:`_export_in_parallel`)."""
    options = export_options(target, path)
    if not _export_in_parallel(executable, path, options.get("fcompile")):
        executable.export_library(str(path), **options)
    return Path(path)


def _export_in_parallel(executable, path, fcompile) -> bool:
    """What ``export_library`` does for a library of LLVM modules, with each module's object file
    (LLVM's code generation: seconds each for a detector) and the packed imports (the VM's
    bytecode and constants) written in threads at once, then linked (or put in a ``.tar``) as
    ``export_library`` links them. False, having written nothing, for anything else (a single
    module, a system library, a C or device module, a linker that wants another object format):
    ``export_library`` itself then."""
    from concurrent.futures import ThreadPoolExecutor

    from tvm.runtime import _ffi_api
    from tvm.support import cc, tar, utils

    from .host import usable_cores

    lib = getattr(executable, "mod", executable)
    modules = lib._collect_dso_modules()
    if len(modules) < 2 or any(m.kind != "llvm" for m in modules) or not lib.imports:
        return False
    if getattr(fcompile, "object_format", "o") != "o":
        return False
    if modules[0].get_function("__tvm_is_system_module")():
        return False
    llvm_target = modules[0].get_function("_get_target_string")()
    if fcompile is None:
        fcompile = tar.tar if str(path).endswith(".tar") else cc.create_shared
    workspace = utils.tempdir()
    objects = [workspace.relpath(f"lib{i}.o") for i in range(len(modules))]
    packed = workspace.relpath("devc.o")

    def write(i: int) -> None:
        if i == len(modules):
            _ffi_api.ModulePackImportsToLLVM(lib, False, llvm_target, "").write_to_file(packed)
        else:
            modules[i].write_to_file(objects[i])

    with ThreadPoolExecutor(min(usable_cores(), len(modules) + 1)) as pool:
        list(pool.map(write, range(len(modules) + 1)))
    fcompile(str(path), [*objects, packed])
    return True


__all__ = [
    "CROSS_LINKERS",
    "choose_library",
    "cross_linker",
    "cross_triple",
    "export_library",
    "export_options",
]
