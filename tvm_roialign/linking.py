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
    """``executable.export_library(path)``, cross-linked where ``target`` needs it; returns ``path``."""
    executable.export_library(str(path), **export_options(target, path))
    return Path(path)


__all__ = [
    "CROSS_LINKERS",
    "choose_library",
    "cross_linker",
    "cross_triple",
    "export_library",
    "export_options",
]
