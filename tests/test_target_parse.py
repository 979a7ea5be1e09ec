"""tvm_roialign.target: short names, tvmc strings, JSON, mcpu checked against LLVM, devices."""

from __future__ import annotations

import json
import platform

import pytest
import tvm
from tvm.target import codegen

from tvm_roialign.schedules import cpu_info
from tvm_roialign.target import (
    DEFAULT_TARGET,
    describe,
    device_for,
    host_config,
    num_cores,
    parse_device,
    parse_target,
    target_config,
)

HOST_CPU = str(codegen.llvm_get_system_cpu())


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, {"kind": "llvm", "mcpu": HOST_CPU, "num-cores": num_cores()}),
        ("native", {"kind": "llvm", "mcpu": HOST_CPU, "num-cores": num_cores()}),
        ("llvm", {"kind": "llvm"}),
        ("llvm-generic", {"kind": "llvm"}),
        ("x86", {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}),
        ("aarch64", {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}),
        ("cuda", {"kind": "cuda", "arch": "sm_80"}),
        ("metal", {"kind": "metal"}),
        ("llvm -mcpu=native", {"kind": "llvm", "mcpu": HOST_CPU}),
        ("llvm -mtriple=aarch64-linux-gnu", {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}),
        (
            "llvm -mcpu=skylake -mattr=+avx2,+fma -num-cores=4",
            {"kind": "llvm", "mcpu": "skylake", "mattr": ["+avx2", "+fma"], "num-cores": 4},
        ),
        ("cuda -arch=sm_90", {"kind": "cuda", "arch": "sm_90"}),
        ('{"kind": "llvm", "mcpu": "native"}', {"kind": "llvm", "mcpu": HOST_CPU}),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"}, None),
    ],
)
def test_parse_target(text, expected):
    target = parse_target(text)
    config = target_config(target)
    if expected is None:
        expected = text
    for key, value in expected.items():
        assert config.get(key) == value, (key, config)
    assert parse_target(target) is target  # a Target is returned as is


def test_default_is_this_machine():
    assert DEFAULT_TARGET == "native"
    config = host_config()
    assert {k: v for k, v in config.items() if k != "mattr"} == {
        "kind": "llvm", "mcpu": HOST_CPU, "num-cores": num_cores()
    }
    assert num_cores() >= 1


def test_native_takes_the_host_features_llvm_lacks():
    """A Sapphire Rapids guest that LLVM calls rocketlake: the AMX and AVX512-BF16 flags of
    /proc/cpuinfo become mattr, those LLVM's CPU already has are left out; a baseline x86 target
    gets the VNNI flag too."""
    from tvm_roialign.target import host_mattr

    flags = {"avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"}
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the x86 flags table applies to an x86-64 host")
    assert host_mattr({"kind": "llvm", "mcpu": "rocketlake"}, flags) == [
        "+avx512bf16", "+amx-tile", "+amx-bf16", "+amx-int8"
    ]
    assert host_mattr({"kind": "llvm", "mcpu": "sapphirerapids"}, flags) == []
    assert "+avx512vnni" in host_mattr({"kind": "llvm", "mcpu": "x86-64"}, flags)
    assert host_mattr({"kind": "llvm", "mcpu": "rocketlake"}, {"sse2"}) == []
    amx = {"kind": "llvm", "mcpu": "rocketlake", "mattr": ["+amx-tile", "+amx-bf16"]}
    info = cpu_info(parse_target(amx))
    assert info.has_amx_bf16 and not cpu_info(parse_target("llvm -mcpu=rocketlake")).has_amx_bf16


def test_plain_llvm_means_generic_cpu():
    """`llvm` keeps TVM's and tvmc's meaning (no mcpu): portable, like `llvm-generic`."""
    assert "mcpu" not in target_config(parse_target("llvm"))
    assert target_config(parse_target("llvm")) == target_config(parse_target("llvm-generic"))


def test_target_from_json_file(tmp_path):
    path = tmp_path / "target.json"
    path.write_text(json.dumps({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}))
    assert target_config(parse_target(str(path)))["mtriple"] == "aarch64-linux-gnu"


@pytest.mark.parametrize(
    "text, words",
    [
        ("tpu", ["unknown target 'tpu'", "native", "llvm -mcpu="]),
        ('{"kind": "bogus"}', ["invalid target"]),
        ('{"kind": ', ["not valid JSON"]),
        ('["llvm"]', ["an object with a 'kind'"]),
        ('{"mcpu": "skylake"}', ["'kind'"]),
        ("missing.json", ["does not exist"]),
        ("", ["empty target"]),
        ("llvm -mcpu=skylak", ["no CPU 'skylak'", "did you mean skylake", "native"]),
        ('{"kind": "llvm", "mcpu": "znver9"}', ["no CPU 'znver9' for this machine's", "did you mean znver"]),
        ("llvm -mtriple=aarch64-linux-gnu -mcpu=skylake", ["no CPU 'skylake' for aarch64"]),
        ("llvm -frobnicate=1", ["no option -frobnicate", "mcpu"]),
        ("llvm -num-cores=many", ["-num-cores takes an integer"]),
        ("llvm mcpu=skylake", ["expected -option=value"]),
    ],
)
def test_parse_target_rejects(text, words):
    with pytest.raises(ValueError) as info:
        parse_target(text)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_describe_is_a_tvmc_string_that_parses_back():
    for text in ("native", "aarch64", "llvm -mcpu=skylake -mattr=+avx2", "cuda -arch=sm_90"):
        target = parse_target(text)
        again = parse_target(describe(target))
        assert target_config(again) == target_config(target), text
    assert describe(parse_target("llvm")) == "llvm"  # this machine's triple left out


def test_devices():
    assert device_for(parse_target("native")) == tvm.cpu()
    with pytest.raises(ValueError, match="cross target"):
        device_for(parse_target("aarch64" if codegen.llvm_get_system_triple().startswith("x86") else "x86"))
    assert parse_device("cpu") == tvm.cpu()
    assert parse_device("cpu:0", parse_target("llvm")) == tvm.cpu(0)
    cases = [
        ("gpu", None, "unknown device 'gpu'"),
        ("cpu:x", None, "integer"),
        ("cuda", parse_target("llvm"), "cannot run a build for llvm (its device is cpu)"),
        ("cpu", parse_target("cuda"), "cannot run a build for cuda (its device is cuda)"),
    ]
    if not tvm.cuda().exist:
        cases.append(("cuda", None, "no cuda device 0"))
    for text, target, words in cases:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            parse_device(text, target)
