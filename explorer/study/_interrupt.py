"""SIGINT (Ctrl-C), SIGTERM and SIGHUP as a request the optimize loop answers at a safe point.

SIGTERM is what Slurm and Kubernetes send on preemption (Slurm to the whole process group), SIGHUP
what a closed terminal or a dropped SSH session sends; each must end a run the way Ctrl-C does.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be, finalizers included,
where it is printed as "Exception ignored" and lost (seen once in a chaos run on PostgreSQL: the
driver printed a traceback and ran on to the end). The loop installs :class:`StopRequest` instead:
the first of these signals only records which one came, and the loop checks each time round (at
least once a second) before it stops launching, marks its trials interrupted and exits with status
128 + the signal's number (130, 143, 129). A second signal raises :class:`Interrupted` at once; once
the loop is stopping (:meth:`StopRequest.stopping`: marking its trials, shutting Ray down), the
signals are back at their default, so another one ends the process there and then, even inside
Ray's C++ (a Python handler runs only when it returns, seconds later; an exception raised inside
``ray.shutdown`` left Ray's core worker running without its raylet, which ended the process with
status 1). Ray's processes die with the driver all the same (Ray starts them with the parent-death
signal), the zygote with its owner, and a trial not yet marked interrupted is re-run on resume.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

__all__ = ["STOP_SIGNALS", "Interrupted", "StopRequest", "signal_name", "signal_of"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop ``explorer optimize`` cleanly."""


class Interrupted(KeyboardInterrupt):
    """A stop signal came: a ``KeyboardInterrupt`` that remembers which (``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15 (the number itself for one Python has no name for)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_of(exc: BaseException) -> int:
    """The signal behind an interrupt: its own for :class:`Interrupted`, SIGINT for a bare
    ``KeyboardInterrupt`` (Python's own Ctrl-C handler raises those)."""
    return exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)


class StopRequest:
    """A context that turns the first stop signal into :attr:`signum` (main thread only)."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.signum: int | None = None
        """The first stop signal that came, or ``None``."""
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal came."""
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # a second signal before the loop saw the first: stop now
            raise Interrupted(self.signum)
        self.signum = signum

    def stopping(self, signum: int) -> int:
        """The loop stops because of ``signum`` (unless a signal came first): from now on another
        stop signal has its default action, and ends the process at once.

        Returns:
            The signal the run stops for.
        """
        if self.signum is None:
            self.signum = signum
        for taken in self._previous:
            signal.signal(taken, signal.SIG_DFL)
        return self.signum

    def check(self) -> None:
        """Raise :class:`Interrupted` if a stop signal came."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    def install(self) -> StopRequest:
        """Take over the signals (main thread only; elsewhere Python delivers no signals)."""
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored (nohup's SIGHUP): stays so
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """Give each signal back to the handler it had before."""
        while self._previous:
            signum, previous = self._previous.popitem()
            # None: a handler set outside Python, which cannot be put back; the default then
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)

    def __enter__(self) -> StopRequest:
        return self.install()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()
