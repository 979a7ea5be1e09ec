"""Where the board tests find their board: ``TVM_ROIALIGN_BOARD=HOST:PORT`` (an RPC server of an
aarch64 device; ``tools/arm_board.sh start`` prints the line to export), and for the tracker test
``TVM_ROIALIGN_BOARD_TRACKER=HOST:PORT`` with ``TVM_ROIALIGN_BOARD_KEY``. Without them (or with
nothing answering there) the board tests skip, saying why."""

from __future__ import annotations

import os
import socket

import pytest

BOARD_ENV = "TVM_ROIALIGN_BOARD"
TRACKER_ENV = "TVM_ROIALIGN_BOARD_TRACKER"
KEY_ENV = "TVM_ROIALIGN_BOARD_KEY"
#: The board's target: the aarch64 generic CPU of ``--target aarch64``.
TARGET = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}


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
    import shutil

    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("no aarch64 cross linker here (apt-get install gcc-aarch64-linux-gnu)")
