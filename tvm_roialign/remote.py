"""Running a compiled library on a remote device over TVM RPC (``tvm.rpc``), as ``tvmc run --rpc-*`` did.

:func:`connect` opens a session with an RPC server (``HOST:PORT``) or asks a tracker for a device
of a key; :func:`load_vm` uploads a library and makes a Relax VM of it on the remote device;
:func:`run_vm` calls a function through the VM's stateful interface (``set_input`` /
``invoke_stateful`` / ``get_outputs``), the one that works over RPC for any return value (a
tuple returned by a plain call comes back as an ``RPCObjectRef`` that cannot be indexed).

An RPC server serves one session at a time: close one (:func:`close`, or drop every reference)
before opening the next.
"""

from __future__ import annotations

from pathlib import Path


def parse_address(text: str, what: str = "RPC address") -> tuple[str, int]:
    """``"HOST:PORT"`` as ``(host, port)``; ValueError naming ``what`` otherwise."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be HOST:PORT (e.g. 127.0.0.1:9090), got {text!r}")
    return host, int(port)


def connect(rpc: str | None = None, tracker: str | None = None, key: str | None = None,
            session_timeout_s: int = 0, tracker_wait_s: int = 60):
    """A ``tvm.rpc`` session: with the server at ``rpc``, or with a device of ``key`` from the
    tracker at ``tracker`` (waiting up to ``tracker_wait_s`` for a free one).

    Raises
    ------
    ValueError
        Both or neither of ``rpc`` and ``tracker``, a tracker without ``key``, a malformed
        address, or nothing answering (the message says where).
    """
    from tvm import rpc as tvm_rpc

    if (rpc is None) == (tracker is None):
        raise ValueError("give either an RPC server (HOST:PORT) or an RPC tracker with a key")
    if rpc is not None:
        host, port = parse_address(rpc, "--rpc")
        try:
            return tvm_rpc.connect(host, port, session_timeout=session_timeout_s)
        except Exception as err:  # noqa: BLE001 - TVM raises TVMError / RuntimeError
            raise ValueError(f"cannot reach the RPC server at {rpc}: {_first_line(err)}") from None
    host, port = parse_address(tracker, "--rpc-tracker")
    if not key:
        raise ValueError("--rpc-tracker needs --rpc-key, the key the devices registered with")
    try:
        client = tvm_rpc.connect_tracker(host, port)
        summary = client.summary()
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"cannot reach the RPC tracker at {tracker}: {_first_line(err)}") from None
    keys = _tracker_keys(summary)
    if key not in keys:
        known = ", ".join(sorted(keys)) or "none"
        raise ValueError(f"the RPC tracker at {tracker} has no device with key {key!r} (keys: {known})")
    try:
        return client.request(key, session_timeout=session_timeout_s, max_retry=max(1, tracker_wait_s // 5))
    except Exception as err:  # noqa: BLE001
        raise ValueError(
            f"no device of key {key!r} from the RPC tracker at {tracker}: {_first_line(err)}"
        ) from None


def _tracker_keys(summary: dict) -> set[str]:
    """The keys of the devices registered at a tracker (its summary: ``server:KEY`` entries)."""
    keys = {str(s.get("key", "")).split(":")[-1] for s in summary.get("server_info", [])}
    return {k for k in keys if k}


def _first_line(err) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def remote_device(session, local_device=None):
    """The session's device matching ``local_device`` (a ``tvm.runtime.Device`` parsed here;
    default: its CPU)."""
    if local_device is None:
        return session.cpu(0)
    return session.device(local_device.dlpack_device_type(), local_device.index)


def load_library(session, library):
    """Upload ``library`` (a ``.so`` built for the remote's architecture) and load it there."""
    library = Path(library)
    session.upload(str(library))
    return session.load_module(library.name)


def load_vm(session, library, device, vm_class=None):
    """Upload ``library`` and return a Relax VM of it on the remote ``device``: ``vm_class``
    (default ``relax.VirtualMachine``; :class:`tvm_roialign.runtime.LoadedVM` for a library with
    load-time weights)."""
    from tvm import relax

    return (vm_class or relax.VirtualMachine)(load_library(session, library), device)


def run_vm(vm, inputs, func: str = "main"):
    """``vm[func](*inputs)`` through the stateful interface: the outputs (a Tensor or a tuple)."""
    vm.set_input(func, *inputs)
    vm.invoke_stateful(func)
    return vm.get_outputs(func)


def close(session) -> None:
    """End an RPC session, so that the server takes the next one."""
    try:
        session._sess.get_function("CloseRPCConnection")()
    except Exception:  # noqa: BLE001 - older servers: dropping the last reference closes it
        pass


__all__ = ["close", "connect", "load_library", "load_vm", "parse_address", "remote_device", "run_vm"]
