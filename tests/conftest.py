"""Shared pytest configuration: the one tolerance table of the suite, the ``cuda`` marker, fixtures
(among them ``rpc_server``: x86 TVM RPC servers on loopback, for tests/test_remote.py and
tests/test_tuning.py).

``@pytest.mark.cuda`` marks a test that needs a CUDA GPU (TVM built with CUDA and a device, and
torch with CUDA where the test compares with it): it is skipped, with that reason, where there is
none. The targets the tests build for are named once in ``tests/_targets.py``.
"""

import functools
import os
import signal
import socket
import subprocess
import sys
import time

#: pytest-xdist's workers in this run (0: no xdist)
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _XDIST_WORKERS > 1:
    # read once, when PyTorch loads its OpenMP: ``import tvm`` below loads PyTorch
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pytest
import tvm

import tvm_roialign  # noqa: F401  (registers on import)
from tvm_roialign import host


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist, each worker takes its share of the usable cores for TVM's pool, its
    workers unpinned (as :func:`tvm_roialign.host.use_usable_cores` does for users), and PyTorch's
    OpenMP threads sleep when idle (above; PyTorch keeps its thread count: eager equality tests
    rely on its two-thread kernels). Without it, ``-n 2`` on 2 cores runs two pools of two spinning
    threads pinned to the same two cores: each parallel kernel waits for a worker the other process
    holds. TVM reads these when its pool starts, at the first parallel kernel; variables the caller
    set are kept. Parallel kernels on more than one thread are still run and checked:
    tests/test_host.py starts its processes with two."""
    if _XDIST_WORKERS > 1:
        os.environ.setdefault(host.ENV_VAR, str(max(1, host.usable_cores() // _XDIST_WORKERS)))
        os.environ.setdefault(host.BIND_VAR, "0")


_share_the_cores_between_workers()

pytest_plugins = ["_hygiene", "_xdist_groups"]

#: Every numeric comparison of the suite, by the dtype of the values compared: ``rtol = atol =
#: TOLERANCE[dtype]``. float16: one rounding of an output of magnitude ~1 (accumulation is float32);
#: float32: float32 rounding of the value sums (the geometry is exact, see test_exactness.py);
#: float64: summation order only; bfloat16 (8 significant bits, float32 accumulation): one
#: round-to-nearest-even of the output, at most 2**-8 of its magnitude; uint8 / int8 (quantized
#: RoIAlign's requantized output): quanta, only where the exact average is at n + 0.5
#: (tests/test_quantized_roi_align.py).
TOLERANCE = {"float16": 4e-3, "bfloat16": 2**-8, "float32": 1e-5, "float64": 1e-9, "uint8": 1,
             "int8": 1}


@pytest.fixture(scope="session")
def tol():
    """:data:`TOLERANCE` (``tol[dtype]``)."""
    return TOLERANCE


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@functools.cache
def cuda_available() -> bool:
    """A CUDA device for TVM (and for torch, where torch is installed)."""
    try:
        if not tvm.cuda(0).exist:
            return False
    except Exception:  # noqa: BLE001 - a TVM built without CUDA
        return False
    try:
        import torch
    except ImportError:
        return True
    return bool(torch.cuda.is_available())


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")


#: Session fixtures that compile a detector: the tests using one run on one xdist worker
#: (``--dist loadgroup``), so that each is compiled once. A test using a session- or module-scoped
#: fixture of its own module is grouped by that module (``module_fixture_group``) for the same reason.
COMPILING_FIXTURES = ("tiny_any_detector", "tiny_keypoint_detector")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU (TVM and torch)")
    module_fixture_group = config.pluginmanager.get_plugin("_xdist_groups").module_fixture_group
    for item in items:
        if item.get_closest_marker("cuda") is not None and not cuda_available():
            item.add_marker(skip)
        if item.get_closest_marker("xdist_group") is not None:
            continue
        fixtures = getattr(item, "fixturenames", ())
        if any(name in fixtures for name in COMPILING_FIXTURES):
            item.add_marker(pytest.mark.xdist_group("tiny_detectors"))
        elif (group := module_fixture_group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))


# --------------------------------------------------------------------------------------------------
# TVM RPC on loopback (what a board runs)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class RPCServers:
    """Starts ``python -m tvm.exec.rpc_server`` processes on loopback and stops them all at the end.

    ``servers()`` starts one to connect to directly and returns its ``"127.0.0.1:PORT"``;
    ``servers(key=KEY)`` starts an ``rpc_tracker`` and one server registered with it under ``KEY``
    and returns the tracker's address. Their output goes to :attr:`log` (one file for all).
    """

    free_port = staticmethod(free_port)

    def __init__(self, log_path, timeout_s: float = 120.0):
        self.log = log_path
        self.timeout_s = timeout_s
        self._file = open(log_path, "w")
        self._procs: list[subprocess.Popen] = []

    def _start(self, module: str, *args: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # a process group of its own: the server serves each session in a child process, which
        # close() ends with it
        self._procs.append(subprocess.Popen([sys.executable, "-m", module, *args], stdout=self._file,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True))

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            assert all(p.poll() is None for p in self._procs), self.log.read_text()
            if ready():
                return
            time.sleep(0.3)
        raise AssertionError(f"{what} not up within {self.timeout_s} s (see {self.log})")

    def __call__(self, key: str | None = None) -> str:
        port = free_port()
        ports = ["--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)]
        if key is None:
            self._start("tvm.exec.rpc_server", *ports)
            self._wait(lambda: _listening(port), "the RPC server")
            return f"127.0.0.1:{port}"
        tracker = free_port()
        self._start("tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(tracker),
                    "--port-end", str(tracker + 1))
        self._start("tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{tracker}", "--key", key, *ports)
        self._wait(lambda: _listening(tracker) and _registered(tracker, key),
                   f"an RPC server of key {key!r}")
        return f"127.0.0.1:{tracker}"

    def close(self) -> None:
        for proc in reversed(self._procs):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)
        self._file.close()


def _registered(tracker: int, key: str) -> bool:
    from tvm import rpc

    summary = rpc.connect_tracker("127.0.0.1", tracker).summary()
    return any(s["key"].endswith(":" + key) for s in summary["server_info"])


@pytest.fixture(scope="module")
def rpc_server(tmp_path_factory):
    """:class:`RPCServers` of the test module (the x86 RPC servers on loopback it starts)."""
    servers = RPCServers(tmp_path_factory.mktemp("rpc") / "rpc.log")
    yield servers
    servers.close()


# --------------------------------------------------------------------------------------------------
# The command line's tiny models and the library compiled from one (tests/test_cli_*.py), made
# once per session


@pytest.fixture(scope="session")
def cli_workdir(tmp_path_factory):
    """The folder of the command-line tests' models, inputs and outputs."""
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="session")
def pt2_model(cli_workdir):
    """(tiny.pt2, inputs.npz with the program's input names, PyTorch's output)."""
    from _cli_models import write_pt2_model

    return write_pt2_model(cli_workdir)


@pytest.fixture(scope="session")
def onnx_model(cli_workdir):
    """(tiny.onnx: conv + RoiAlign with a symbolic roi count, inputs.npz, onnxruntime's output)."""
    pytest.importorskip("onnx")
    from _cli_models import write_roi_onnx_model

    return write_roi_onnx_model(cli_workdir)


@pytest.fixture(scope="session")
def gather_model(cli_workdir):
    """An ONNX Gather + Relu (its build makes TVM print a C++ warning)."""
    pytest.importorskip("onnx")
    from _cli_models import write_gather_model

    return write_gather_model(cli_workdir)


@pytest.fixture(scope="session")
def pt2_lib(pt2_model, cli_workdir):
    """The tiny .pt2 model compiled with every default (native target, NHWC)."""
    from tvm_roialign import cli

    lib = cli_workdir / "tiny_default.so"
    assert cli.main(["-q", "compile", str(pt2_model[0]), "-o", str(lib)]) == 0
    return lib


@pytest.fixture(scope="session")
def tiny_any_detector(tmp_path_factory):
    """``(library, model)``: a tiny Mask R-CNN (tests/_tiny_rcnn.py, seed 1, 12 detections)
    compiled exact (``fast=False``: compared with eager by the exact criterion), otherwise with the
    defaults, one function for every photo size (tests/test_runtime.py, tests/test_cpp_deploy.py)."""
    pytest.importorskip("torchvision")
    from _tiny_rcnn import tiny_rcnn

    from tvm_roialign.models import detection as det

    model = tiny_rcnn(masks=True, seed=1, detections_per_img=12)
    library = det.compile_detector(model, target="llvm", fast=False).export(
        tmp_path_factory.mktemp("any") / "tiny_any.so"
    )
    return library, model


@pytest.fixture(scope="session")
def tiny_keypoint_detector(tmp_path_factory):
    """``(library, model)``: a small Keypoint R-CNN (tests/_tiny_rcnn.py, seed 2, 12 detections,
    COCO's 17 keypoints) compiled exact (``fast=False``), one function for every photo size
    (tests/test_cli_outputs.py, tests/test_cpp_deploy.py)."""
    pytest.importorskip("torchvision")
    from _tiny_rcnn import tiny_keypoint_rcnn

    from tvm_roialign.models import detection as det

    model = tiny_keypoint_rcnn(seed=2, detections_per_img=12, num_keypoints=17)
    library = det.compile_detector(model, target="llvm", fast=False).export(
        tmp_path_factory.mktemp("keypoints") / "kp.so"
    )
    return library, model
