"""SIGINT and SIGTERM stop a run cleanly: what a stopped run raises and how the command line
says it.

A run asked to stop (Ctrl-C on a terminal, `kill`, a batch scheduler's SIGTERM) ends its
workers and verifier processes, syncs its journal and leaves the run directory as a crash
would, resumable; `invar train` says so as the signal arrives, then prints one line naming the
update it stopped at, the command that resumes it and the one that draws its report (report.md
is written at a run's end), and exits 128 + the signal's number (130, 143), the shell's
convention for a process ended by a signal.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The run stopped on a signal (`signum`) with `committed` of `total` updates done."""

    def __init__(self, signum: int, committed: int, total: int, run_dir: Path | str,
                 resumable: bool = True) -> None:
        self.signum = signum
        self.committed = committed
        self.total = total
        self.run_dir = Path(run_dir)
        self.resumable = resumable
        super().__init__(self.line())

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        how = (f"resume with: invar train --resume {self.run_dir}" if self.resumable else
               "a serial run cannot be resumed: start it again with another output.run_dir")
        # A stopped run has no report.md (the end of a run writes it): say how to draw one.
        return (f"interrupted at update {self.committed} of {self.total}; {how}; its report "
                f"so far: invar report {self.run_dir}")


class Signalled(BaseException):
    """Raised in the main thread by `signals_raise` when SIGINT or SIGTERM arrives (a
    BaseException, as KeyboardInterrupt is: no `except Exception` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Signalled` in the main thread while the block runs (SIGTERM
    would otherwise end the process at once, with no cleanup); the handlers before are put
    back after it. An event loop's own handlers (`Driver.run`) take over while it runs."""

    def raise_signalled(signum: int, frame: FrameType | None) -> None:
        raise Signalled(signum)

    before = {signum: signal.signal(signum, raise_signalled) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
