"""The progress display of long subcommands: a rich spinner with the current step on stderr, and
for a schedule search a progress bar (trials done of the run's, best time per task, ETA)."""

from __future__ import annotations

import contextlib
import time

from ._common import tvm_messages


class Progress:
    """Call it with a line of text per step. On a terminal: a spinner plus a log line per step;
    otherwise plain ``[  12.3 s] step`` lines; nothing with ``quiet``."""

    def __init__(self, quiet: bool = False):
        from rich.console import Console

        self.console = Console(stderr=True, quiet=quiet, log_path=False)
        self.status = None
        self.bar = None
        self.t0 = time.perf_counter()

    def __enter__(self):
        if self.console.is_terminal:
            self.status = self.console.status("starting")
            self.status.__enter__()
        return self

    def __call__(self, message: str) -> None:
        self._end_bar()
        elapsed = time.perf_counter() - self.t0
        if self.status is not None:
            self.status.update(f"[bold]{message}[/] ({elapsed:.0f} s)")
            self.console.log(message)
        else:
            # one line per step however long (task names are never cut)
            self.console.print(f"[{elapsed:6.1f} s] {message}", highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        """One line for the user (``note: ...``), printed as is (no markup); nothing with ``quiet``."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def search_status(self, status) -> None:
        """A measured batch of a schedule search (:class:`~tvm_roialign.tuning.SearchStatus`):
        on a terminal the bar moves and a line per batch is printed above it; otherwise one plain
        line per batch."""
        if self.status is None or self.console.quiet:
            self(status.line())
            return
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self.status.stop()
            self.bar = Bar(
                TextColumn("[bold]search"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("trials, ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.start()
            self.bar_task = self.bar.add_task("search", total=status.total)
        self.bar.update(self.bar_task, completed=status.done, total=status.total)
        self.console.print(status.line(), markup=False, highlight=False, soft_wrap=True)

    def _end_bar(self) -> None:
        """Back to the spinner after a search's bar."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
            self.status.start()

    def __exit__(self, *exc):
        self._end_bar()
        if self.status is not None:
            self.status.__exit__(*exc)


@contextlib.contextmanager
def progress_session(quiet: bool = False):
    """A :class:`Progress` display inside :func:`~._common.tvm_messages`: TVM's messages are
    collected while the display runs and printed once it has ended, so that the display (a spinner
    or a search's bar, started and stopped as the work goes) never writes to a stream the collection
    has closed."""
    with tvm_messages(quiet), Progress(quiet) as progress:
        yield progress
