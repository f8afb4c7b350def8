"""The live progress footer of ``explorer optimize``: on a terminal only; ETA from this run's pace."""

from __future__ import annotations

import io

from explorer.progress import LiveProgress, format_eta, terminal_progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_unless_stdout_is_a_terminal():
    assert terminal_progress(io.StringIO()) is None  # pytest, pipes, files: today's plain lines
    assert isinstance(terminal_progress(_Tty()), LiveProgress)


def test_footer_counts_best_and_eta_from_this_runs_pace():
    now = [100.0]
    live = LiveProgress(file=_Tty(), clock=lambda: now[0])
    assert live.text() == "starting... 0:00 elapsed" and live.eta_seconds() is None
    live.update(done=2, total=10, running=1, queued=0, best=None)  # resumed at 2 done
    now[0] += 30
    assert live.eta_seconds() is None  # nothing finished in this run yet
    live.update(done=4, total=10, running=1, queued=2, best=(1234.56, 3))
    assert live.eta_seconds() == 6 * 15.0  # 2 trials in 30 s, 6 to go
    assert live.text() == (
        "trials 4/10 done, 1 running, 2 queued | best 1234.6 (trial 3) | 0:30 elapsed, ETA 1:30"
    )
    assert format_eta(3725) == "1:02:05" and format_eta(None) == "-"


def test_lines_print_above_the_footer_as_they_are():
    out = _Tty()
    with LiveProgress(file=out) as live:
        live.update(done=0, total=3, running=1, queued=0, best=None)
        live.print("[  1/3] trial 0    ok       bs=[4] gpus=1 | best 1.0 (trial 0)")
    assert "[  1/3] trial 0    ok       bs=[4] gpus=1 | best 1.0 (trial 0)" in out.getvalue()
