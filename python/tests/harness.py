"""Real processes for the end-to-end tests: the kernel binary on port 0 with a database of its
own, and worker processes, each with its output read line by line so a test waits on what a
process says rather than on a clock. What can only be polled is polled by `eventually`, with a
deadline. Every process started here is killed when its test ends, however it ends (conftest.py),
a test over the per-test time limit included.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, TypeVar

REPO = Path(__file__).resolve().parents[2]
PYTHON_TESTS = Path(__file__).resolve().parent
WAIT = 30.0
"""How long any single wait may take before the test fails with what was seen."""
POLL = 0.02
"""How often `eventually` looks again."""

T = TypeVar("T")


def target_dir() -> Path:
    """Where cargo builds: $CARGO_TARGET_DIR when set, as cargo itself reads it, else target/."""
    return Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target").resolve()


def binary(name: str) -> Path:
    """A binary of the workspace's debug build; tests/run.sh builds them first."""
    target = target_dir()
    for folder in ("debug", "debug/examples"):
        path = target / folder / name
        if path.exists():
            return path
    raise RuntimeError(
        f"no {name} binary under {target}: run `cargo build --workspace --bins --examples` first"
    )


async def eventually(
    what: str,
    probe: Callable[[], Awaitable[T]],
    timeout: float = WAIT,
) -> T:
    """The one way a test waits on something it can only poll: `probe` looks once and answers
    what it saw, which is what the test waits for when truthy. It is asked again every `POLL`
    seconds for at most `timeout`; then the test fails with what it waited for and the last
    thing seen. Where a process says it (`Process.said`) or a stream carries it, wait on that
    instead."""
    deadline = time.monotonic() + timeout
    while True:
        seen = await probe()
        if seen:
            return seen
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout} s for {what}; last saw: {seen!r}")
        await asyncio.sleep(POLL)


async def within(what: str, awaitable: Awaitable[T], timeout: float = WAIT) -> T:
    """Awaits `awaitable` for at most `timeout` seconds; past it the test fails saying what it
    waited for, where a bare `asyncio.wait_for` says only that time ran out."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise AssertionError(f"waited {timeout} s for {what}") from None


class Process:
    """A child process whose stdout and stderr lines are kept, in order, as they come."""

    started: ClassVar[set[Process]] = set()
    """Every process started and not yet stopped here: `stop_all` ends them with their test."""

    def __init__(self, args: list[str], label: str, env: dict[str, str] | None = None) -> None:
        self.label = label
        self.lines: list[str] = []
        """Every line so far, in order."""
        self._ended = False
        self._changed = threading.Condition()
        self._seen = 0
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        Process.started.add(self)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = WAIT) -> str:
        """The next line (after those already waited past) holding `text`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                while self._seen < len(self.lines):
                    line = self.lines[self._seen]
                    self._seen += 1
                    if text in line:
                        return line
                if self._ended:
                    code = self.process.wait()
                    raise AssertionError(
                        f"{self.label} exited ({code}) before saying {text!r}; "
                        f"it said:\n{self.log()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{self.label} never said {text!r}; it said:\n{self.log()}"
                    )
                self._changed.wait(left)

    async def said(self, text: str, timeout: float = WAIT) -> str:
        """`wait_for`, off the event loop."""
        return await asyncio.to_thread(self.wait_for, text, timeout)

    def log(self) -> str:
        return "\n".join(self.lines[-80:])

    def kill9(self) -> None:
        """SIGKILL: the process dies mid-whatever, with no chance to say goodbye."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=WAIT)

    def terminate(self, timeout: float = WAIT) -> int:
        """SIGTERM, then the exit code once it has ended."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=WAIT)
        Process.started.discard(self)

    @classmethod
    def stop_all(cls) -> list[str]:
        """Kills every process started here that is still running; returns their labels."""
        killed: list[str] = []
        for process in list(cls.started):
            if process.process.poll() is None:
                killed.append(f"{process.label} (pid {process.process.pid})")
            process.stop()
        return killed


class Kernel:
    """The kernel binary on a port of its own, with short leases so a lost worker is seen fast."""

    def __init__(self, folder: Path, *args: str) -> None:
        self.folder = folder
        self.args = args
        self.http = ""
        """The HTTP listener's address, when the kernel was given `--http-listen`."""
        self.process, self.addr = self._spawn("127.0.0.1:0")

    def _spawn(self, listen: str) -> tuple[Process, str]:
        database = str(self.folder / "kernel.db")
        process = Process(
            [str(binary("kernel")), "--listen", listen, "--db", database, *self.args],
            "kernel",
            env={
                "KERNEL_HEARTBEAT_INTERVAL_MS": "200",
                "KERNEL_LEASE_TTL_MS": "1500",
                "KERNEL_DRAIN_TIMEOUT_MS": "2000",
                "KERNEL_LOG": "info",
            },
        )
        addr = _addr(process.wait_for("listening"))
        if "--http-listen" in self.args:
            self.http = _addr(process.wait_for("http listening"))
        return process, addr

    def restart(self) -> None:
        """SIGKILL, then the kernel again on the same database and address."""
        self.process.kill9()
        self.process, addr = self._spawn(self.addr)
        assert addr == self.addr

    def stop(self) -> None:
        self.process.stop()


@contextmanager
def kernel_with_policy(folder: Path, policy: str, *args: str) -> Iterator[Kernel]:
    """A kernel whose policy file holds `policy`, with /metrics served; stopped after the body."""
    path = folder / "policy.yaml"
    path.write_text(policy)
    started = Kernel(folder, "--policy", str(path), "--http-listen", "127.0.0.1:0", *args)
    try:
        yield started
    finally:
        started.stop()


def _addr(line: str) -> str:
    """The `addr=` of a kernel's log line."""
    addr = next((w.removeprefix("addr=") for w in line.split() if w.startswith("addr=")), None)
    if addr is None:
        raise AssertionError(f"no addr= in the kernel's line {line!r}")
    return addr


def python_worker(kernel: Kernel, *args: str) -> Process:
    """`worker_process.py` in its own Python process, serving the tests' tools."""
    return Process(
        [sys.executable, "-u", str(PYTHON_TESTS / "worker_process.py"), kernel.addr, *args],
        f"python worker {' '.join(args)}",
    )


def scrape(kernel: Kernel) -> dict[str, float]:
    """Every sample of `/metrics`, by its name and labels as written."""
    with urllib.request.urlopen(f"http://{kernel.http}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("application/openmetrics-text")
        text = response.read().decode()
    assert text.rstrip().endswith("# EOF")
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples
