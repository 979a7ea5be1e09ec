"""Targets: short names, tvmc strings, JSON, and the device a build runs on.

:func:`parse_target` turns what a user writes into a ``tvm.target.Target``:

* a short name (:data:`TARGETS`): ``native`` (this machine's CPU, the default everywhere),
  ``llvm`` / ``llvm-generic`` (a portable build: generic CPU of this machine's architecture, what
  plain ``llvm`` means to TVM and tvmc), ``x86`` (generic x86-64), ``aarch64`` / ``arm``
  (generic AArch64, a cross target on other machines), ``cuda`` (sm_80), ``metal``;
* a tvmc target string, ``KIND -option=value ...``: ``"llvm -mcpu=native"``,
  ``"llvm -mtriple=aarch64-linux-gnu -mattr=+neon"``, ``"cuda -arch=sm_90"`` (TVM 0.27 itself
  takes dicts only);
* a JSON object (text or a ``.json`` file) or a dict: ``{"kind": "llvm", "mcpu": "skylake"}``;
* a ``tvm.target.Target`` (returned as is).

An llvm ``mcpu`` of ``native`` becomes this machine's CPU (``llvm_get_system_cpu()``), with the
bf16 / int8 matrix and dot-product features the host reports and LLVM's CPU lacks added to ``mattr``
(:func:`host_mattr`: AMX and AVX512-BF16 on a Sapphire Rapids guest LLVM calls ``rocketlake``); any other
``mcpu`` must be a CPU LLVM knows for the target's triple (LLVM itself would only print a warning
per function and build generic code). :func:`target_config` is the inverse for reports,
:func:`describe` the tvmc-style one-line form, :func:`device_for` the device to run a build on here.
Errors are ``ValueError`` with one line that names the target; callers (the CLI) add their flag.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
from pathlib import Path

import tvm
from tvm.target import codegen

from .host import cpu_flags, host_machine, is_host_triple, usable_cores

#: The target used when none is given (CLI and Python defaults).
DEFAULT_TARGET = "native"

#: Short target names (``native`` is resolved on this machine, see :func:`host_config`).
TARGETS = {
    "native": None,
    "llvm": {"kind": "llvm"},
    "llvm-generic": {"kind": "llvm"},
    "x86": {"kind": "llvm", "mtriple": "x86_64-linux-gnu"},
    "aarch64": {"kind": "llvm", "mtriple": "aarch64-linux-gnu"},
    "arm": {"kind": "llvm", "mtriple": "aarch64-linux-gnu"},
    "cuda": {"kind": "cuda", "arch": "sm_80"},
    "metal": {"kind": "metal"},
}

_EXAMPLES = '\'llvm -mcpu=skylake\' (a tvmc string) or \'{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}\''


def num_cores() -> int:
    """Cores this process may run on (:func:`tvm_roialign.host.usable_cores`)."""
    return usable_cores()


def host_config() -> dict:
    """The ``native`` target: llvm for this machine's CPU, with ``num-cores`` for MetaSchedule and,
    in ``mattr``, the matrix and dot-product features the host reports that LLVM's name for its
    CPU lacks (:func:`host_mattr`)."""
    config = {"kind": "llvm", "mcpu": str(codegen.llvm_get_system_cpu())}
    mattr = host_mattr(config)
    if mattr:
        config["mattr"] = mattr
    return {**config, "num-cores": num_cores()}


#: ``/proc/cpuinfo`` flags (x86 ``flags``, AArch64 ``Features``) -> the LLVM feature they mean; the
#: features that choose kernels (bf16 and int8 matrix and dot-product instructions) and no others
HOST_FEATURES = {
    "x86_64": {
        "avx512_bf16": "avx512bf16",
        "avx512_fp16": "avx512fp16",
        "avx512_vnni": "avx512vnni",
        "avx_vnni": "avxvnni",
        "amx_tile": "amx-tile",
        "amx_bf16": "amx-bf16",
        "amx_int8": "amx-int8",
    },
    "aarch64": {"bf16": "bf16", "asimddp": "dotprod", "i8mm": "i8mm"},
}


def host_mattr(config: dict, flags: set[str] | None = None) -> list[str]:
    """``+feature`` for each of :data:`HOST_FEATURES` that this machine reports (``flags``, default
    ``/proc/cpuinfo``) and LLVM's features for ``config`` lack: LLVM names a Sapphire Rapids guest
    ``rocketlake``, which has no AMX or AVX512-BF16."""
    table = HOST_FEATURES.get(host_machine(), {})
    flags = cpu_flags() if flags is None else flags
    wanted = [feature for flag, feature in table.items() if flag in flags]
    if not wanted:
        return []
    known = {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target(config))}
    return [f"+{feature}" for feature in wanted if feature not in known]


def _convert(value: str, kind_type: str, key: str, kind: str):
    if kind_type.startswith("Array"):
        return [v for v in value.split(",") if v]
    if kind_type == "int":
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"target {kind} option -{key} takes an integer, got {value!r}") from None
    if kind_type == "bool":
        if value.lower() in ("1", "true", "on", "yes"):
            return True
        if value.lower() in ("0", "false", "off", "no"):
            return False
        raise ValueError(f"target {kind} option -{key} takes true or false, got {value!r}")
    return value


def parse_tvmc_string(text: str) -> dict:
    """``"llvm -mcpu=skylake -mattr=+avx2,+fma"`` -> ``{"kind": "llvm", "mcpu": "skylake", ...}``.

    Option types come from TVM's target kind (lists split at commas, integers, booleans; a bare
    ``-option`` is true).

    Raises
    ------
    ValueError
        Unknown kind or option, or a value of the wrong type.
    """
    words = shlex.split(text)
    kind = words[0]
    kinds = [str(k) for k in tvm.target.Target.list_kinds()]
    if kind not in kinds:
        raise ValueError(
            f"unknown target {text!r}: use one of {', '.join(TARGETS)}, a target kind "
            f"({', '.join(sorted(k for k in kinds if k not in ('test', 'ext_dev', 'composite')))}) "
            f"with options, e.g. {_EXAMPLES}"
        )
    options = {str(k): str(v) for k, v in tvm.target.TargetKind.options_from_name(kind).items()}
    config: dict = {"kind": kind}
    for word in words[1:]:
        key, sep, value = word.lstrip("-").partition("=")
        if not word.startswith("-") or not key:
            raise ValueError(f"target {text!r}: expected -option=value, got {word!r}")
        if key not in options or key in ("kind", "host"):
            known = ", ".join(k for k in options if k not in ("kind", "host", "tag"))
            raise ValueError(f"target {kind} has no option -{key}; it takes {known}")
        config[key] = _convert(value, options[key], key, kind) if sep else True
    return config


def _config_from_text(text: str) -> dict:
    if text in TARGETS:
        return TARGETS[text] or host_config()
    if text.startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"target is not valid JSON ({err.msg}): {text}") from None
    if text.endswith(".json"):
        if not os.path.isfile(text):
            raise ValueError(f"target file {text!r} does not exist")
        try:
            return json.loads(Path(text).read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"target file {text!r} is not valid JSON ({err.msg})") from None
    if not text:
        raise ValueError(f"empty target: use one of {', '.join(TARGETS)} or {_EXAMPLES}")
    return parse_tvmc_string(text)


def _check_mcpu(config: dict) -> dict:
    """``mcpu=native`` resolved; any other ``mcpu`` checked against LLVM's CPUs for the triple."""
    mcpu = config.get("mcpu")
    if config.get("kind") != "llvm" or not mcpu:
        return config
    if mcpu == "native":
        resolved = {**config, "mcpu": str(codegen.llvm_get_system_cpu())}
        if not config.get("mtriple") or is_host_triple(str(config["mtriple"])):
            extra = [f for f in host_mattr(resolved) if f not in (config.get("mattr") or [])]
            if extra:
                resolved["mattr"] = [*(config.get("mattr") or []), *extra]
        return resolved
    triple = str(config.get("mtriple") or codegen.llvm_get_system_triple())
    if codegen.llvm_is_valid_cpu(str(mcpu), triple):
        return config
    probe = tvm.target.Target({"kind": "llvm", "mtriple": triple})
    known = [str(c) for c in codegen.llvm_get_cpu_archlist(probe)]
    close = difflib.get_close_matches(str(mcpu), known, n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    native = ""
    if triple == str(codegen.llvm_get_system_triple()):
        native = f"'native' for this machine ({codegen.llvm_get_system_cpu()}) or "
    # this machine's triple names its LLVM's vendor (x86_64-conda-linux-gnu): its CPU family says it
    where = config.get("mtriple") or f"this machine's {triple.split('-')[0]}"
    raise ValueError(
        f"LLVM knows no CPU {mcpu!r} for {where}: {hint}use {native}one of the {len(known)} "
        "names of tvm.target.codegen.llvm_get_cpu_archlist"
    )


def parse_target(text=None) -> tvm.target.Target:
    """A ``tvm.target.Target`` from a short name, a tvmc string, JSON text or file, or a dict.

    ``None`` is :data:`DEFAULT_TARGET` (``native``). See the module docstring for the forms.

    Raises
    ------
    ValueError
        Unknown short name or kind, invalid JSON, an ``mcpu`` LLVM does not know, or a target TVM
        does not accept.
    """
    if isinstance(text, tvm.target.Target):
        return text
    if text is None:
        text = DEFAULT_TARGET
    config = text if isinstance(text, dict) else _config_from_text(str(text).strip())
    if not isinstance(config, dict) or "kind" not in config:
        raise ValueError(f"a JSON target must be an object with a 'kind', got {config!r}")
    config = _check_mcpu(config)
    try:
        return tvm.target.Target(config)
    except Exception as err:  # noqa: BLE001 - TVM raises ValueError / TVMError
        first = str(err).strip().splitlines()[0]
        raise ValueError(f"invalid target {json.dumps(config)}: {first}") from None


_REPORTED = ("mtriple", "arch", "mcpu", "mattr", "num-cores")


def target_config(target: tvm.target.Target) -> dict:
    """The JSON-able essentials of ``target`` (kind, mtriple, arch, mcpu, mattr, num-cores)."""
    config: dict = {"kind": target.kind.name}
    for key in _REPORTED:
        value = target.attrs.get(key)
        if value is None or value == "" or (key == "mattr" and not list(value)):
            continue
        if key == "mattr":
            config[key] = [str(v) for v in value]
        elif key == "num-cores":
            config[key] = int(value)
        else:
            config[key] = str(value)
    return config


def describe(target) -> str:
    """tvmc-style one line (``llvm -mcpu=skylake -num-cores=2``); this machine's triple left out."""
    config = target_config(target) if isinstance(target, tvm.target.Target) else dict(target)
    host_triple = str(codegen.llvm_get_system_triple())
    parts = [str(config.get("kind", "?"))]
    for key, value in config.items():
        if key == "kind" or (key == "mtriple" and value == host_triple):
            continue
        value = ",".join(value) if isinstance(value, list) else value
        parts.append(f"-{key}={value}")
    return " ".join(parts)


def is_cross(target: tvm.target.Target) -> bool:
    """Whether an llvm ``target`` is for another CPU architecture than this machine's."""
    if target.kind.name != "llvm":
        return False
    return not is_host_triple(target.attrs.get("mtriple", ""))


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
                f"{host_machine()} machine"
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


#: Device names for :func:`parse_device` -> the target kinds whose builds they run.
DEVICES = {
    "cpu": "llvm",
    "cuda": "cuda",
    "metal": "metal",
    "rocm": "rocm",
    "vulkan": "vulkan",
    "opencl": "opencl",
}


def parse_device(text: str, target: tvm.target.Target | None = None):
    """``"cpu"``, ``"cuda"``, ``"cuda:1"``... -> a ``tvm.runtime.Device`` that exists here.

    With ``target``, the device must be of the kind the build is for.

    Raises
    ------
    ValueError
        Unknown device name, no such device here, or a device of another kind than ``target``.
    """
    name, _, index = str(text).strip().lower().partition(":")
    if name not in DEVICES:
        raise ValueError(f"unknown device {text!r}: use {', '.join(DEVICES)} (optionally :INDEX)")
    try:
        number = int(index) if index else 0
    except ValueError:
        raise ValueError(f"device {text!r}: the index after ':' must be an integer") from None
    if target is not None and DEVICES[name] != target.kind.name:
        own = [d for d, k in DEVICES.items() if k == target.kind.name]
        raise ValueError(
            f"device {text!r} cannot run a build for {target.kind.name}"
            + (f" (its device is {own[0]})" if own else "")
        )
    if target is not None and is_cross(target):
        device_for(target)  # raises: a cross build runs nowhere here
    dev = tvm.device(name, number)
    if not dev.exist:
        raise ValueError(f"no {name} device {number} on this machine")
    return dev


__all__ = [
    "DEFAULT_TARGET",
    "DEVICES",
    "TARGETS",
    "describe",
    "device_for",
    "device_or_none",
    "host_config",
    "host_mattr",
    "is_cross",
    "num_cores",
    "parse_device",
    "parse_target",
    "parse_tvmc_string",
    "target_config",
]
