"""The progress display of ``tune``'s search (:class:`tvm_roialign.cli._progress.Progress` fed
:class:`tvm_roialign.tuning.SearchStatus`), on a terminal and off one, without a search: the task's
full name, trials done of the run's, the best time and an ETA in each case. The display in a real
search is checked in tests/test_tuning.py (``--tasks 1``)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from tvm_roialign.cli._progress import Progress
from tvm_roialign.tuning import SearchStatus
from tvm_roialign.tuning.search_loop import format_eta

NAME = "fused_conv2d_NCHWc_add_relu_with_a_name_longer_than_a_terminal_line_of_eighty_columns_0"


def _status(done: int, elapsed_s: float) -> SearchStatus:
    best = {NAME: 1.25e-3}
    return SearchStatus(task=NAME, measured=2, done=done, total=8, best_s=best, elapsed_s=elapsed_s)


def test_status_line_and_eta():
    status = _status(2, 30.0)
    assert status.eta_s == 90.0  # 15 s per trial so far, 6 trials left
    assert status.line() == f"{NAME}: best 1.250 ms; 2/8 trials of the run, ETA 1m30s"
    assert SearchStatus(task=NAME, measured=0, done=0, total=8).line().endswith(
        "no valid candidate yet; 0/8 trials of the run, ETA ?"
    )
    assert [format_eta(s) for s in (None, 42.4, 185, 3725)] == ["?", "42s", "3m05s", "1h02m"]


def _shown(terminal: bool) -> str:
    out = io.StringIO()
    with Progress() as progress:
        progress.console = Console(file=out, force_terminal=terminal, width=80, log_path=False)
        if terminal:  # the spinner the display starts with on a terminal
            progress.status = progress.console.status("starting")
            progress.status.start()
        progress.search_status(_status(2, 30.0))
        progress.search_status(_status(4, 50.0))
        progress("checking 1 record(s)")
        if terminal:
            progress.status.stop()
    return out.getvalue()


def test_off_a_terminal_one_whole_line_per_batch():
    lines = _shown(terminal=False).splitlines()
    assert len(lines) == 3, lines
    assert lines[0].endswith(f"{NAME}: best 1.250 ms; 2/8 trials of the run, ETA 1m30s")
    assert lines[1].endswith(f"{NAME}: best 1.250 ms; 4/8 trials of the run, ETA 50s")


def test_on_a_terminal_a_bar_and_the_batches_logged():
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", _shown(terminal=True))  # without the cursor moves
    assert "━" in shown  # the bar
    assert f"{NAME}: best 1.250 ms; 4/8 trials of the run, ETA 50s" in shown, shown


_SESSION_ON_A_TERMINAL = """
from tvm_roialign.cli._progress import progress_session
from tvm_roialign.tuning import SearchStatus
with progress_session(False) as progress:
    progress("import")
    for done in (2, 4):
        progress.search_status(SearchStatus(task="t", measured=2, done=done, total=4, elapsed_s=1.0))
    progress("checking the records")  # the spinner again, after the search's bar
print("finished", flush=True)
"""


def test_a_search_on_a_terminal_ends_cleanly():
    """The CLI's display on a real terminal (a pseudo-terminal here): the spinner, a search's bar
    and the spinner again inside the collection of TVM's messages, then a normal exit."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SESSION_ON_A_TERMINAL], stdout=follower, stderr=follower, close_fds=True
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    output = b"".join(chunks).decode(errors="replace")
    assert proc.wait(timeout=60) == 0, output
    assert "finished" in output and "closed file" not in output, output
