"""Targets: short names, parsing, the device a build runs on.

:func:`parse_target` turns what a user writes (a short name such as ``llvm`` or ``aarch64``, a JSON
object, a dict or a ``tvm.target.Target``) into a ``tvm.target.Target``; :func:`target_config` is
the inverse for reports; :func:`device_for` is the device to run a build on here. Errors are
``ValueError`` with one line that names the target; callers (the CLI) map them to their own form.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import tvm

#: Short target names; anything else must be a JSON object such as {"kind": "llvm"}.
TARGETS = {
    "llvm": {"kind": "llvm"},
    "x86": {"kind": "llvm"},
    "aarch64": {"kind": "llvm", "mtriple": "aarch64-linux-gnu"},
    "arm": {"kind": "llvm", "mtriple": "aarch64-linux-gnu"},
    "cuda": {"kind": "cuda", "arch": "sm_80"},
    "metal": {"kind": "metal"},
}


def parse_target(text) -> tvm.target.Target:
    """A ``tvm.target.Target`` from a short name (llvm, aarch64, cuda, metal), JSON text or a dict.

    Raises
    ------
    ValueError
        Unknown short name, invalid JSON, or a target TVM does not accept.
    """
    if isinstance(text, tvm.target.Target):
        return text
    if isinstance(text, dict):
        config = text
    else:
        text = str(text).strip()
        if text in TARGETS:
            config = TARGETS[text]
        elif text.startswith("{"):
            try:
                config = json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"target is not valid JSON ({err.msg}): {text}") from None
        elif text.endswith(".json") and os.path.isfile(text):
            config = json.loads(Path(text).read_text())
        else:
            names = ", ".join(TARGETS)
            raise ValueError(
                f"unknown target {text!r}: use one of {names} or a JSON object such as "
                '\'{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}\''
            )
    if not isinstance(config, dict) or "kind" not in config:
        raise ValueError(f"a JSON target must be an object with a 'kind', got {config!r}")
    try:
        return tvm.target.Target(config)
    except Exception as err:  # noqa: BLE001 - TVM raises ValueError / TVMError
        first = str(err).strip().splitlines()[0]
        raise ValueError(f"invalid target {json.dumps(config)}: {first}") from None


def target_config(target: tvm.target.Target) -> dict:
    """The JSON-able essentials of ``target`` (kind, mtriple, arch, mcpu) for reports and metadata."""
    config = {"kind": target.kind.name}
    for key in ("mtriple", "arch", "mcpu"):
        value = target.attrs.get(key) if hasattr(target, "attrs") else None
        if value:
            config[key] = str(value)
    return config


def _host_machine() -> str:
    return os.uname().machine.replace("arm64", "aarch64")


def is_cross(target: tvm.target.Target) -> bool:
    """Whether an llvm ``target`` is for another CPU architecture than this machine's."""
    if target.kind.name != "llvm":
        return False
    triple = str(target.attrs.get("mtriple", "") or "")
    return bool(triple) and not triple.startswith(_host_machine())


def device_for(target: tvm.target.Target):
    """The device to run ``target``'s builds on, here.

    Raises
    ------
    ValueError
        ``target`` is a cross target, or this machine has no device of its kind.
    """
    kind = target.kind.name
    if kind == "llvm":
        if is_cross(target):
            triple = target.attrs.get("mtriple")
            raise ValueError(
                f"target llvm -mtriple={triple} is a cross target; it cannot run on this "
                f"{os.uname().machine} machine"
            )
        return tvm.cpu()
    dev = tvm.device(kind, 0)
    if not dev.exist:
        raise ValueError(f"no {kind} device on this machine to run on")
    return dev


def device_or_none(target: tvm.target.Target):
    """:func:`device_for`, or None where this machine cannot run ``target``."""
    try:
        return device_for(target)
    except ValueError:
        return None


__all__ = ["TARGETS", "device_for", "device_or_none", "is_cross", "parse_target", "target_config"]
