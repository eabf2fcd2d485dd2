"""A real `campanile serve` for the session: on SQLite, and on PostgreSQL too when
`CAMPANILE_TEST_PG_URL` is set (in a schema of its own, dropped at the end). Every test runs
once per node, on queues of its own."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import httpx
import pytest

from campanile import Client

REPO = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("CAMPANILE_BIN", REPO / "target" / "debug" / "campanile"))
PG_URL = os.environ.get("CAMPANILE_TEST_PG_URL", "")
BACKENDS = ["sqlite"] + (["postgres"] if PG_URL else [])

T = TypeVar("T")


def pytest_report_header() -> list[str]:
    lines = [f"campanile binary: {BIN}"]
    if not PG_URL:
        lines.append("skipped: CAMPANILE_TEST_PG_URL is not set (the PostgreSQL runs)")
    return lines


@dataclass
class Node:
    """A running `campanile serve` and the default tenant's key."""

    backend: str
    url: str
    key: str
    proc: subprocess.Popen[str]
    log: Path

    def client(self) -> Client:
        return Client(self.url, self.key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, check: Callable[[], T | None], timeout: float = 30.0, every: float = 0.05) -> T:
    """Polls `check` until it answers something truthy; fails naming `what` after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(every)


def psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", PG_URL, "-c", sql],
        check=True,
        capture_output=True,
        timeout=60,
    )


def start_node(backend: str, database: str, workdir: Path) -> Node:
    if not BIN.exists():
        pytest.fail(f"no campanile binary at {BIN}: cargo build -p campanile-cli, or set CAMPANILE_BIN")
    port = free_port()
    log = workdir / f"serve-{backend}.log"
    env = {**os.environ, "CAMPANILE_LOG": "warn"}
    proc = subprocess.Popen(
        [str(BIN), "serve", "--listen", f"127.0.0.1:{port}", "--database", database],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read(stdout: object) -> None:
        # Drains stdout for the node's whole life, so that it never blocks on a full pipe.
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, args=(proc.stdout,), daemon=True).start()
    # The first start prints the default tenant's key, alone on its line.
    key = None
    deadline = time.monotonic() + 60
    while key is None:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            proc.kill()
            pytest.fail(f"campanile serve printed no key ({backend}); see {log}: {log.read_text()[-2000:]}")
        if line.strip().startswith("cmp_"):
            key = line.strip()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(f"campanile serve ready ({backend})", ready, timeout=60)
    return Node(backend=backend, url=url, key=key, proc=proc, log=log)


def stop_node(node: Node) -> None:
    if node.proc.poll() is None:
        node.proc.send_signal(signal.SIGTERM)
        try:
            node.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait()


@pytest.fixture(scope="session", params=BACKENDS)
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    backend: str = request.param
    workdir = tmp_path_factory.mktemp(backend)
    if backend == "sqlite":
        n = start_node(backend, str(workdir / "t.db"), workdir)
        try:
            yield n
        finally:
            stop_node(n)
        return
    schema = f"campanile_py_{uuid.uuid4().hex[:16]}"
    psql(f"CREATE SCHEMA {schema}")
    try:
        sep = "&" if "?" in PG_URL else "?"
        n = start_node(backend, f"{PG_URL}{sep}options=-csearch_path%3D{schema}", workdir)
        try:
            yield n
        finally:
            stop_node(n)
    finally:
        psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def client(node: Node) -> Iterator[Client]:
    with node.client() as c:
        yield c


@pytest.fixture
def queue_name() -> str:
    """A queue of the test's own."""
    return f"py-{uuid.uuid4().hex[:12]}"
