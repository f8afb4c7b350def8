"""Ray's error-channel messages (a lost node's raylet log) go to a file, with one line a minute.

The real path (a raylet SIGKILLed under a running trial) is
``tests/test_multinode.py::test_a_lost_node_fails_its_trial_in_one_line_without_rays_node_logs``
(slow); these check the rules on the messages Ray sends there, quoted from that run."""

from __future__ import annotations

import io

from explorer.launch._ray_messages import QUIET_S, RayMessages, summary

RAYLET_DIED = (
    "Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL by the user "
    "or system OOM killer, (2) Invalid memory access from Raylet causing SIGSEGV or SIGBUS, (3) Other "
    "termination signals. Last 20 lines of the Raylet logs:\n"
    + "".join(f"    [2026-11-25 14:09:41,901 I 1 1] (raylet) accessor.cc:475: line {i}\n" for i in range(20))
)
NODE_DEAD = (
    "The node with node id: 4531f9b0724ff464be3d4d20c24b29ac046bd4e6d97c532ea79c0048 and address: "
    "192.0.2.2 and node name: 192.0.2.2 has been marked dead because the detector has missed too many "
    "heartbeats from it. This can happen when a \t(1) raylet crashes unexpectedly (OOM, etc.) \n"
    "\t(2) raylet has lagging heartbeats due to slow network or busy workload."
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _raylet(text: str) -> dict:
    return {"lines": [text], "pid": "raylet", "is_err": False}


def test_a_lost_node_is_one_line_and_its_messages_are_kept_whole(tmp_path):
    out, clock = io.StringIO(), Clock()
    log = tmp_path / "runs" / "ray-messages.log"  # its folder is made
    messages = RayMessages(log_path=log, stream=out, clock=clock)
    messages(_raylet(RAYLET_DIED), False)  # one per agent of the node
    messages(_raylet(RAYLET_DIED), False)
    clock.now = 30.0
    messages(_raylet(NODE_DEAD), False)  # the GCS, once its health checks missed
    lines = out.getvalue().splitlines()
    said = "ray: a Ray node's raylet died (killed, out of memory, or crashed), the trials on it fail"
    assert lines == [f"{said}; Ray's report: {log}"]
    kept = log.read_text()
    assert kept.count("Raylet is terminated") == 2 and kept.count("line 19\n") == 2 and "marked dead" in kept
    clock.now = 30.0 + QUIET_S  # a minute after the last line: another loss gets its line
    messages(_raylet(NODE_DEAD), False)
    assert out.getvalue().splitlines()[1].startswith("ray: Ray marked node 4531f9b0724f (192.0.2.2) dead")


def test_other_output_goes_to_rays_printer_and_a_message_that_cannot_be_kept_says_so(tmp_path):
    seen = []
    blocked = tmp_path / "file"
    blocked.write_text("")
    out = io.StringIO()
    messages = RayMessages(log_path=blocked / "ray-messages.log", stream=out)
    messages._original = lambda data, ignore_prefix: seen.append(data)
    worker_line = {"lines": ["hello"], "pid": 12, "is_err": False}
    messages(worker_line, True)
    assert seen == [worker_line] and out.getvalue() == ""
    messages(_raylet("Some new Ray warning\nsecond line"), False)
    assert (
        out.getvalue() == f"ray: Some new Ray warning; not kept in {blocked}/ray-messages.log (File exists)\n"
    )
    assert summary("x" * 150).endswith("x" * 100 + "...")


def test_install_takes_over_rays_printer_once_and_restore_gives_it_back(tmp_path):
    from ray._private import worker

    original = worker.print_to_stdstream
    first, second = (RayMessages(log_path=tmp_path / "m.log") for _ in range(2))
    try:
        assert first.install() and worker.print_to_stdstream is first
        assert not second.install()  # a launcher's Ray restarted: the one already there stays
        first.restore()
        assert worker.print_to_stdstream is original
    finally:
        worker.print_to_stdstream = original
