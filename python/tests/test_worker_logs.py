"""What a worker says with no logging configured, as one built from the Python guide's snippets
runs: that it connected (its name, tools and kernel), each backoff while it cannot reach the kernel
(with the hint), and that it drains and stops."""

from __future__ import annotations

import socket
import sys

from harness import PYTHON_TESTS, Kernel, Process, python_worker


def _closed_port() -> int:
    """A port nothing listens on: bound for a moment, then closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_a_worker_that_cannot_reach_the_kernel_says_so_at_each_backoff() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    worker = Process(
        [
            sys.executable,
            "-u",
            str(PYTHON_TESTS / "worker_process.py"),
            address,
            "--no-logging-config",
            "--name",
            "lost",
        ],
        "python worker against a closed port",
    )
    try:
        for attempt in (1, 2):
            line = await worker.said("cannot reach the kernel")
            assert f"worker=lost kernel={address} attempt={attempt} retry_in_ms=" in line, line
            assert f"(is a kernel listening on {address}?)" in line, line
        assert worker.terminate() == 0, worker.log()
        assert any("worker stopped worker=lost" in line for line in worker.lines), worker.log()
    finally:
        worker.stop()


async def test_a_worker_says_it_connected_with_its_tools_and_that_it_drains(
    kernel: Kernel,
) -> None:
    worker = python_worker(kernel, "--no-logging-config", "--name", "talkative")
    try:
        line = await worker.said("worker session open")
        assert "INFO kernel_sdk.worker" in line, line
        assert f"worker=talkative kernel={kernel.addr} tools=py_charge,py_fetch" in line, line
        assert worker.terminate() == 0, worker.log()
        assert any(
            f"worker draining worker=talkative kernel={kernel.addr} in_flight=0" in line
            for line in worker.lines
        ), worker.log()
        assert any("worker stopped worker=talkative" in line for line in worker.lines)
    finally:
        worker.stop()
