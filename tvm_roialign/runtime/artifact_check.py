"""The checks a compiled library passes before TVM's runtime loads it.

``compile`` (and :meth:`tvm_roialign.models.detection.DetectorArtifact.export`) record the
library's size and SHA-256 in its metadata file ``LIB.json`` (:func:`library_record`, under
:data:`RECORD_KEY`). :func:`check_library` compares the library with that record before it is
loaded: a truncated, grown or corrupted library, a missing metadata file, one that is not JSON or
one without the record is refused with one line naming the file (an :class:`ArtifactError`), where
loading it could crash the process (a truncated shared library is a bus error). For libraries
built elsewhere (no record) the comparison can be turned off (``verify=False``, the command line's
``--no-verify``); the structural check of an ELF file's headers runs either way.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

__all__ = ["RECORD_KEY", "ArtifactError", "check_library", "library_record", "metadata_path"]

#: The key of the metadata that holds the library's ``{"size": bytes, "sha256": hex}``.
RECORD_KEY = "library"

_CHUNK = 1 << 20


class ArtifactError(ValueError):
    """A library or its metadata file that is not safe to load: one line naming the file."""


def metadata_path(library) -> Path:
    """``LIB.json``, the metadata file beside ``library``."""
    return Path(str(library) + ".json")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def library_record(library) -> dict:
    """``{"size": bytes, "sha256": hex}`` of the library file: what the metadata records."""
    path = Path(library)
    return {"size": path.stat().st_size, "sha256": _sha256(path)}


def _read_metadata(library, required: bool, override: str) -> dict | None:
    """The metadata of ``library`` as a dict; None when there is none and it is not ``required``."""
    path = metadata_path(library)
    if not path.exists():
        if not required:
            return None
        raise ArtifactError(
            f"{str(library)!r} has no metadata file {path.name!r} beside it to check the library "
            f"against (compile writes one); for a library built elsewhere pass {override}"
        )
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ArtifactError(
            f"{str(path)!r} is not valid JSON ({err.msg} at line {err.lineno}, column "
            f"{err.colno}); compile the library again"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{str(path)!r} cannot be read: {err}") from None
    if not isinstance(meta, dict):
        raise ArtifactError(
            f"{str(path)!r} holds a JSON {type(meta).__name__}, not the object compile writes"
        )
    return meta


def _check_record(library: Path, meta: dict, override: str) -> None:
    """The library against the size and SHA-256 its metadata records."""
    path = metadata_path(library)
    record = meta.get(RECORD_KEY)
    if not (
        isinstance(record, dict)
        and isinstance(record.get("size"), int)
        and isinstance(record.get("sha256"), str)
    ):
        raise ArtifactError(
            f"{str(path)!r} records no size and sha256 of the library (key {RECORD_KEY!r}; "
            f"written by compile since this version); compile again, or pass {override} to load "
            "it unchecked"
        )
    size = library.stat().st_size
    if size != record["size"]:
        how = "truncated" if size < record["size"] else "longer than what compile wrote"
        raise ArtifactError(
            f"{str(library)!r} is {size} bytes, {path.name!r} records {record['size']}: the "
            f"library is {how}; compile it again (or copy it whole)"
        )
    if _sha256(library) != record["sha256"].lower():
        raise ArtifactError(
            f"{str(library)!r} does not match the sha256 recorded in {path.name!r} (same size, "
            "other bytes): the file is corrupted or was replaced; compile it again"
        )


def _check_elf(library: Path) -> None:
    """An ELF file whose headers point past its end (a truncated shared library) is refused."""
    size = library.stat().st_size
    with open(library, "rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF":
            return
        if len(head) < 52 or head[4] not in (1, 2) or head[5] not in (1, 2):
            raise ArtifactError(f"{str(library)!r} is cut short: its ELF header is incomplete")
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        layout = order + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH")
        fields = struct.unpack_from(layout, head, 16)
        phoff, shoff = fields[4], fields[5]
        phentsize, phnum, shentsize, shnum = fields[8], fields[9], fields[10], fields[11]
        end = max(phoff + phentsize * phnum, shoff + shentsize * shnum if shnum else 0)
        if phnum and phentsize:
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
            entry = order + ("IIQQQQ" if wide else "IIIIII")
            for i in range(len(table) // phentsize):
                values = struct.unpack_from(entry, table, i * phentsize)
                offset, filesz = (values[2], values[5]) if wide else (values[1], values[4])
                end = max(end, offset + filesz)
    if end > size:
        raise ArtifactError(
            f"{str(library)!r} is cut short: its ELF headers reach byte {end} of a {size}-byte "
            "file; compile it again (or copy it whole)"
        )


def check_library(library, verify: bool = True, override: str = "verify=False") -> dict:
    """The metadata of ``library`` (``{}`` when there is none and ``verify`` is off), after
    checking that the library is a file, that it matches the size and SHA-256 its metadata
    records (``verify``) and that an ELF file is whole. ``override`` names, in the messages, how
    the caller turns ``verify`` off. Raises :class:`ArtifactError` (FileNotFoundError when the
    library does not exist)."""
    path = Path(library)
    if not path.exists():
        raise FileNotFoundError(f"compiled library {str(path)!r} does not exist")
    if not path.is_file():
        raise ArtifactError(f"compiled library {str(path)!r} is not a file")
    meta = _read_metadata(path, verify, override)
    if verify:
        _check_record(path, meta, override)
    _check_elf(path)
    return meta or {}
