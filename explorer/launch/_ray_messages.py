"""Ray's error messages to the driver, kept out of the driver's output.

Every Ray driver runs a thread (``ray._private.worker.listen_error_messages``) that prints each
error message the cluster publishes to its job, or to every driver, on stdout as ``(raylet)``
lines, whatever ``log_to_driver`` says. A lost node sends two kinds: each of its agents sends the
raylet's last 20 log lines ("Raylet is terminated ...": 43 lines for the two agents), and the GCS
later sends "The node with node id ... has been marked dead" (3 lines). explorer answers each loss
where it strikes, in the line of the trial it failed, so :class:`RayMessages` appends every such
message whole to ``ray-messages.log`` in the run folder and prints one line on stderr: at most one
a minute (one lost node, one line).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

__all__ = ["RayMessages", "error_line", "plain"]

QUIET_S = 60.0
"""After a line about Ray's messages, the next one is kept to the file only for this long."""

_NODE_DEAD = re.compile(r"node id: (\w+) and address: (\S+) .*marked dead")
_RAYLET_DIED = "Raylet is terminated"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TASK_HEADER = re.compile(r"^ray::\S+ \(pid=")
"""The first line of a task's error (``ray::TrialActor.run() (pid=..., ip=...)``): where, not why."""


def plain(text: str) -> str:
    """``text`` without terminal colour codes (Ray colours the header of a task's error)."""
    return _ANSI.sub("", text)


def error_line(exc: BaseException) -> str:
    """One plain line for a Ray error: what the task raised, else the first line of Ray's own
    words that is not the task's header (an actor that died: how)."""
    from explorer.oom import failure_line

    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        return plain(failure_line(cause))
    lines = [line.strip() for line in plain(str(exc)).splitlines() if line.strip()]
    said = [line for line in lines if not _TASK_HEADER.match(line)]
    return (said or lines or [type(exc).__name__])[0]


def summary(text: str) -> str:
    """What one of Ray's messages says, in a few words."""
    dead = _NODE_DEAD.search(text)
    if dead:
        return f"Ray marked node {dead.group(1)[:12]} ({dead.group(2)}) dead, the trials on it fail"
    if text.startswith(_RAYLET_DIED):
        return "a Ray node's raylet died (killed, out of memory, or crashed), the trials on it fail"
    first = text.strip().splitlines()[0] if text.strip() else "(empty)"
    return f"{first[:100]}{'...' if len(first) > 100 else ''}"


class RayMessages:
    """Stands in for Ray's ``print_to_stdstream`` while a launcher's own Ray runs
    (:meth:`install`, :meth:`restore`): the error channel's messages (``pid`` ``raylet``) go to
    ``log_path``, with one line on ``stream``; anything else to Ray's own printer.

    Args:
        log_path: the file the messages are appended to (its folder is made if missing).
        stream: where the one line goes (default: stderr at the time of the message).
        clock: seconds, monotonic (tests pass their own).
        lost: what of the local Ray died (``None``: nothing), asked before each line: a message
            about the loss of the local Ray itself goes to the file only, the run says it in its
            own line (:class:`explorer.launch.RayLost`).
    """

    def __init__(
        self,
        *,
        log_path: Path,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        lost: Callable[[], str | None] | None = None,
    ) -> None:
        self.log_path = log_path
        self._stream = stream
        self._clock = clock
        self._lost = lost
        self._lock = threading.Lock()
        self._last_line: float | None = None
        self._original: Any = None

    def install(self) -> bool:
        """Take over Ray's printer; ``False`` when this Ray has none to take over."""
        from ray._private import worker

        original = getattr(worker, "print_to_stdstream", None)
        if original is None or isinstance(original, RayMessages):
            return False
        self._original = original
        worker.print_to_stdstream = self  # Ray reads this global at each message
        return True

    def restore(self) -> None:
        """Give Ray its printer back."""
        from ray._private import worker

        if self._original is not None and worker.print_to_stdstream is self:
            worker.print_to_stdstream = self._original
        self._original = None

    def __call__(self, data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            self._original(data, ignore_prefix)
            return
        text = "\n".join(str(line) for line in data.get("lines", []))
        with self._lock:
            kept = self._keep(text)
            if self._lost is not None and self._lost() is not None:
                return
            now = self._clock()
            if self._last_line is not None and now - self._last_line < QUIET_S:
                return
            self._last_line = now
            where = (
                f"Ray's report: {self.log_path}" if kept is None else f"not kept in {self.log_path} ({kept})"
            )
            stream = self._stream or sys.stderr
            print(f"ray: {summary(text)}; {where}", file=stream, flush=True)

    def _keep(self, text: str) -> str | None:
        """Append ``text`` to the file; the reason it could not be kept, or ``None``."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as f:
                f.write(f"--- {stamp}\n{text.rstrip()}\n")
        except OSError as exc:
            return exc.strerror or type(exc).__name__
        return None
