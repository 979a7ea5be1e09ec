"""Where the board tests find their board: ``TVM_ROIALIGN_BOARD=HOST:PORT`` (an RPC server of an
aarch64 device; ``tools/arm_board.sh start`` prints the line to export), and for the tracker test
``TVM_ROIALIGN_BOARD_TRACKER=HOST:PORT`` with ``TVM_ROIALIGN_BOARD_KEY``. The C++ program's board
test runs programs in the emulated board's root itself (``tools/arm_board.sh setup``, under
``TVM_ROIALIGN_BOARD_DIR``) through qemu-user. Without them (or with nothing answering there) the
board tests skip, saying why."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

BOARD_ENV = "TVM_ROIALIGN_BOARD"
TRACKER_ENV = "TVM_ROIALIGN_BOARD_TRACKER"
KEY_ENV = "TVM_ROIALIGN_BOARD_KEY"
DIR_ENV = "TVM_ROIALIGN_BOARD_DIR"
#: The board's target: the aarch64 generic CPU of ``--target aarch64``.
TARGET = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
#: The board's target with the bf16 and int8 dot products (qemu-user's CPU has them; an Arm
#: Neoverse V1 / N2 class core does).
PRECISION_TARGET = {**TARGET, "mattr": ["+neon", "+bf16", "+dotprod", "+i8mm"]}


def _reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        return True
    except (OSError, ValueError):
        return False


def board_address(env: str = BOARD_ENV) -> str:
    """The address in ``env``, or a skip saying how to get a board."""
    address = os.environ.get(env)
    if not address:
        pytest.skip(f"no board: set {env}=HOST:PORT (tools/arm_board.sh start sets one up on loopback)")
    if not _reachable(address):
        pytest.skip(f"no board answers at {env}={address} (tools/arm_board.sh start)")
    return address


def require_cross_linker() -> None:
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("no aarch64 cross linker here (apt-get install gcc-aarch64-linux-gnu)")


def board_root() -> Path:
    """The emulated board's root with TVM's aarch64 wheels (``tools/arm_board.sh setup``), or a
    skip saying how to get one."""
    folder = Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "tvm-roialign" / "arm-board")
    root = folder / "root"
    if not (root / "opt" / "tvm" / ".done").exists():
        pytest.skip(f"no emulated board at {root}: tools/arm_board.sh setup (as root; {DIR_ENV} moves it)")
    return root


def qemu_aarch64() -> str:
    """qemu-user for aarch64 programs (Debian's qemu-user-static), or a skip."""
    for name in ("qemu-aarch64-static", "qemu-aarch64"):
        if shutil.which(name):
            return name
    pytest.skip("no qemu-aarch64 here (apt-get install qemu-user-static)")


def require_cross_cxx() -> None:
    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("no aarch64 cross C++ compiler here (apt-get install g++-aarch64-linux-gnu)")
