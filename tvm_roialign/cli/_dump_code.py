"""``compile --dump-code``: the Relax module built, its scheduled TIR and the CPU code beside the
library."""

from __future__ import annotations

from pathlib import Path

from ._common import CLIError, first_line

DUMP_FORMATS = ("relax", "tir", "ll", "asm")


def dump_formats(text) -> list[str]:
    """The formats of ``--dump-code`` (a one-line error for an unknown one)."""
    if not text:
        return []
    formats = [f.strip().lower() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in DUMP_FORMATS]
    if unknown or not formats:
        raise CLIError(
            f"--dump-code: unknown format {', '.join(unknown) or text!r}; use {','.join(DUMP_FORMATS)}"
        )
    return formats


def write_dumps(out: Path, formats, mod, tir_mod, executable) -> list[str]:
    """``OUT.FORMAT`` for each of ``formats``: the Relax module built, its scheduled TIR, the CPU
    code's LLVM IR or assembly; the names written."""
    from tvm import tirx

    written = []
    for fmt in formats:
        path = Path(f"{out}.{fmt}")
        if fmt == "relax":
            text = mod.script()
        elif fmt == "tir":
            if tir_mod is None:
                raise CLIError("--dump-code tir: the build pipeline did not expose its TIR")
            funcs = {gv: f for gv, f in tir_mod.functions_items() if isinstance(f, tirx.PrimFunc)}
            text = "\n\n".join(f.script() for f in funcs.values())
        else:
            host = executable.mod.imports[0] if executable.mod.imports else None
            try:
                # every module of the kernels (built in several threads, one module each)
                text = "\n\n".join(m.inspect_source(fmt) for m in host._collect_dso_modules())
            except Exception as err:  # noqa: BLE001 - not an LLVM module (cross .tar, GPU host)
                raise CLIError(
                    f"--dump-code {fmt}: not available for this build ({first_line(err)})"
                ) from None
        path.write_text(text)
        written.append(path.name)
    return written
