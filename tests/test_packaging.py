"""The installed TVM stack can serialize IR (MetaSchedule and every IR tool need ``tvm.ir.save_json``).

apache-tvm-ffi 0.1.15.x segfaults in ``tvm.ir.save_json`` of any node; pyproject.toml pins a working
version. The round trip runs in a child process so that a segfault is reported as a failure with its
exit signal rather than killing the test worker.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_save_json_round_trips_a_module():
    code = textwrap.dedent(
        """
        import tvm
        from tvm import relax
        import tvm_roialign

        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType([2, 3], "float32"))
        with bb.function("main", [x]):
            bb.emit_func_output(bb.emit(relax.op.add(x, x)))
        mod = bb.get()
        text = tvm.ir.save_json(mod)
        tvm.ir.assert_structural_equal(tvm.ir.load_json(text), mod)
        print("ok", len(text))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), (
        f"tvm.ir.save_json failed (exit {proc.returncode}); "
        f"apache-tvm-ffi must be <0.1.15: {proc.stderr[-2000:]}"
    )
