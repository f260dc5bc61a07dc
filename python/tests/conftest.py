"""Fixtures: a real redis-server per test module, and peer processes
(python/tests/peer.py) driven over pipes. Every wait has a deadline."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll_until(fn, timeout: float, what: str):
    """Calls fn until it returns a true value; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server not installed (make deps)")
    port = free_port()
    d = tmp_path_factory.mktemp("redis")
    p = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(d)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    try:
        poll_until(up, 10, "redis-server")
        yield f"redis://127.0.0.1:{port}"
    finally:
        p.terminate()
        p.wait(10)


class PeerProc:
    """A peer.py process: JSON commands on stdin, one JSON reply per line."""

    def __init__(self, *args: str, env: dict | None = None, script: str = "peer.py"):
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(
            [sys.executable, str(HERE / script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=e,
            text=True,
            bufsize=1,
        )
        self.ready = self.reply(30)

    @property
    def pid(self) -> int:
        return self.p.pid

    def reply(self, timeout: float = 20) -> dict:
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not r:
            raise AssertionError(f"peer gave no answer in {timeout}s")
        line = self.p.stdout.readline()
        if not line:
            err = self.p.stderr.read() if self.p.poll() is not None else ""
            raise AssertionError(f"peer exited (rc {self.p.poll()}): {err[-2000:]}")
        msg = json.loads(line)
        if "error" in msg:
            raise AssertionError(f"peer: {msg['error']}")
        return msg

    def cmd(self, timeout: float = 20, **kw) -> dict:
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        return self.reply(timeout)

    def stop(self, timeout: float = 5) -> None:
        """SIGSTOP, then waits until every thread of the peer has stopped:
        kill() returns before they all have, and a thread still running
        could serve the request the test expects to time out (as
        tests/lib/freeze.sh's pid_freeze)."""
        os.kill(self.p.pid, signal.SIGSTOP)
        tasks = Path(f"/proc/{self.p.pid}/task")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            states = []
            for t in tasks.iterdir():
                try:
                    states.append((t / "stat").read_text().rsplit(")", 1)[1].split()[0])
                except (FileNotFoundError, IndexError):
                    continue
            if states and all(st in ("T", "t") for st in states):
                return
            time.sleep(0.01)
        raise AssertionError(f"peer {self.p.pid} did not stop within {timeout} s")

    def cont(self) -> None:
        os.kill(self.p.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)

    def close(self) -> None:
        if self.p.poll() is None:
            self.cont()
            try:
                self.p.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.p.stdin.flush()
                self.p.wait(10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.kill()
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            f.close()


@pytest.fixture
def peers():
    """Starts peer processes on demand; all are closed after the test."""
    made: list[PeerProc] = []

    def start(*args: str, **kw) -> PeerProc:
        p = PeerProc(*args, **kw)
        made.append(p)
        return p

    yield start
    for p in made:
        p.close()


@pytest.fixture
def node_name(request):
    """A node id unique to the test (the registry is shared by a module)."""
    return request.node.name.replace("[", "-").replace("]", "")[:40] + f"-{os.getpid()}"
