"""The progress display of long subcommands: a rich spinner with the current step on stderr."""

from __future__ import annotations

import time


class Progress:
    """Call it with a line of text per step. On a terminal: a spinner plus a log line per step;
    otherwise plain ``[  12.3 s] step`` lines; nothing with ``quiet``."""

    def __init__(self, quiet: bool = False):
        from rich.console import Console

        self.console = Console(stderr=True, quiet=quiet, log_path=False)
        self.status = None
        self.t0 = time.perf_counter()

    def __enter__(self):
        if self.console.is_terminal:
            self.status = self.console.status("starting")
            self.status.__enter__()
        return self

    def __call__(self, message: str) -> None:
        elapsed = time.perf_counter() - self.t0
        if self.status is not None:
            self.status.update(f"[bold]{message}[/] ({elapsed:.0f} s)")
            self.console.log(message)
        else:
            self.console.print(f"[{elapsed:6.1f} s] {message}", highlight=False)

    def note(self, text: str) -> None:
        """One line for the user (``note: ...``), printed as is (no markup); nothing with ``quiet``."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def __exit__(self, *exc):
        if self.status is not None:
            self.status.__exit__(*exc)
