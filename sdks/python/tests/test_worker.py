"""The workers against a real node: a schedule run through them, the outcome classes, reports
that claim their successors, claims sent again after a lost answer, a lost lease stopping its
handler, a stalled worker's late report refused, a SIGKILLed worker taken over at epoch 2, and
SIGTERM leaving nothing RUNNING."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from campanile import (
    AsyncClient,
    AsyncWorker,
    Client,
    Job,
    LeaseLost,
    PermanentError,
    TransientError,
    Worker,
    WorkerConfig,
    WorkerReport,
)
from conftest import Node, wait_until

YEARLY = "0 0 1 1 *"
CHILD = Path(__file__).with_name("child_worker.py")


def ready(client: Client, queue: str, payloads: list[Any], **extra: Any) -> list[str]:
    """One triggered occurrence per payload, each of a schedule of its own: ready now."""
    ids = []
    for p in payloads:
        s = client.create_schedule({"queue": queue, "cron": YEARLY, "payload": p, **extra})
        ids.append(client.trigger_schedule(s.id).id)
    return ids


def states(client: Client, ids: list[str]) -> list[str]:
    return [client.get_occurrence(i).state for i in ids]


def config(queue: str, **kw: Any) -> WorkerConfig:
    kw.setdefault("idle_poll", 0.05)
    return WorkerConfig(queue=queue, **kw)


def in_thread(worker: Worker, handler: Any) -> tuple[threading.Thread, list[WorkerReport]]:
    out: list[WorkerReport] = []
    t = threading.Thread(target=lambda: out.append(worker.run(handler)), daemon=True)
    t.start()
    return t, out


def stop(worker: Worker, t: threading.Thread, out: list[WorkerReport]) -> WorkerReport:
    worker.stop()
    t.join(30)
    assert not t.is_alive(), "the worker stops"
    return out[0]


class Recording(httpx.HTTPTransport):
    """Records each request (path, JSON body) and its answer's JSON; loses the answers of
    the first `lose_claims` plain claims after the server has carried them out."""

    def __init__(self, lose_claims: int = 0) -> None:
        super().__init__()
        self.lose_claims = lose_claims
        self.sent: list[tuple[str, Any, Any]] = []
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        response = super().handle_request(request)
        answer = json.loads(response.read() or b"null")
        with self.lock:
            self.sent.append((request.url.path, body, answer))
            lose = request.url.path.endswith("/claim") and self.lose_claims > 0
            self.lose_claims -= lose
        if lose:
            response.close()
            raise httpx.ReadError("the answer was lost", request=request)
        return response

    def paths(self, suffix: str) -> list[Any]:
        with self.lock:
            return [b for p, b, _ in self.sent if p.endswith(suffix)]

    def answers(self, suffix: str) -> list[Any]:
        with self.lock:
            return [a for p, _, a in self.sent if p.endswith(suffix)]


class AsyncRecording(httpx.AsyncHTTPTransport):
    """`Recording` for the asyncio client."""

    def __init__(self, lose_claims: int = 0) -> None:
        super().__init__()
        self.lose_claims = lose_claims
        self.sent: list[tuple[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.sent.append((request.url.path, body))
        response = await super().handle_async_request(request)
        if request.url.path.endswith("/claim") and self.lose_claims > 0:
            self.lose_claims -= 1
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("the answer was lost", request=request)
        return response

    def paths(self, suffix: str) -> list[Any]:
        return [b for p, b in self.sent if p.endswith(suffix)]


def test_a_schedule_runs_through_the_sync_worker(client: Client, queue_name: str) -> None:
    s = client.create_schedule({"queue": queue_name, "cron": "* * * * * *", "payload": {"hello": "world"}})
    seen: list[Job] = []

    def handler(job: Job) -> dict[str, Any]:
        seen.append(job)
        return {"seen": job.id, "payload": job.payload, "attempt": job.attempt, "epoch": job.epoch}

    worker = Worker(client, config(queue_name))
    t, out = in_thread(worker, handler)

    def succeeded() -> list[Any]:
        return [o for o in client.list_occurrences(schedule_id=s.id, state="SUCCEEDED").occurrences]

    done = wait_until("two occurrences of a schedule run by the worker", lambda: (lambda d: d if len(d) >= 2 else None)(succeeded()))
    report = stop(worker, t, out)
    client.cancel_schedule(s.id)
    assert report.completed >= 2 and report.failed == report.lost == report.refused == 0, report
    one = client.get_occurrence(done[0].id)
    assert one.result == {"seen": one.id, "payload": {"hello": "world"}, "attempt": 1, "epoch": 1}
    assert all(j.schedule_id == s.id and j.queue == queue_name and j.scheduled_for.tzinfo for j in seen)
    assert not client.list_occurrences(schedule_id=s.id, state="RUNNING").occurrences


def test_success_and_the_failure_classes(client: Client, queue_name: str) -> None:
    retry = {"max_attempts": 2, "backoff_initial_ms": 10, "backoff_max_ms": 10}
    ok, flaky, broken, crashing, odd = ready(
        client, queue_name,
        [{"kind": "ok"}, {"kind": "flaky"}, {"kind": "broken"}, {"kind": "crash"}, {"kind": "odd"}],
        retry=retry,
    )

    def handler(job: Job) -> Any:
        kind = job.payload["kind"]
        if kind == "flaky" and job.attempt == 1:
            raise TransientError("try again")
        if kind == "broken":
            raise PermanentError("cannot ever work")
        if kind == "crash":
            raise RuntimeError("a bug")
        if kind == "odd":
            return {"not json": object()}
        return {"kind": kind, "attempt": job.attempt}

    worker = Worker(client, config(queue_name, concurrency=3))
    t, out = in_thread(worker, handler)
    wait_until(
        "every occurrence ends",
        lambda: states(client, [ok, flaky, broken, crashing, odd]) == ["SUCCEEDED", "SUCCEEDED", "DEAD", "DEAD", "DEAD"],
    )
    report = stop(worker, t, out)
    assert (report.completed, report.failed) == (2, 5), report
    assert client.get_occurrence(flaky).result == {"kind": "flaky", "attempt": 2}
    outcomes = [(a.outcome, a.error_class) for a in client.get_occurrence(flaky).attempts or []]
    assert outcomes == [("failed", "transient"), ("succeeded", None)]
    dead = client.get_occurrence(broken)
    assert dead.attempt_count == 1 and dead.last_error == "cannot ever work"
    # Any other exception is transient: retried until the attempts run out.
    crashed = client.get_occurrence(crashing)
    assert crashed.attempt_count == 2 and "RuntimeError: a bug" in (crashed.last_error or "")
    # A result that is not JSON is a permanent failure.
    assert client.get_occurrence(odd).attempt_count == 1


def test_each_report_claims_its_successor(node: Node, queue_name: str) -> None:
    transport = Recording()
    with Client(node.url, node.key, transport=transport) as client:
        ids = ready(client, queue_name, [{"i": i} for i in range(12)])
        worker = Worker(client, config(queue_name, concurrency=2, batch=1))
        t, out = in_thread(worker, lambda job: job.payload)
        wait_until("the backlog drains", lambda: set(states(client, ids)) == {"SUCCEEDED"})
        report = stop(worker, t, out)
    assert report.completed == 12
    reports = transport.paths("/v1/completions")
    assert len(reports) == 12 and all(len(r["items"]) == 1 for r in reports), "one report per occurrence"
    claiming = [r for r in reports if "claim" in r]
    assert claiming and all(r["claim"]["queue"] == queue_name and r["claim"]["max"] == 1 for r in claiming)
    assert all("claim_key" in r["claim"] for r in claiming)
    # Plain claims only fill the slots at the start (and poll once a report found the queue
    # empty); every other occurrence came with a report.
    claims = transport.paths("/claim")
    assert all(c["max"] <= 2 and "claim_key" in c for c in claims)
    by_claims = sum(len(a["occurrences"]) for a in transport.answers("/claim"))
    by_reports = sum(len(a.get("claimed") or []) for a in transport.answers("/v1/completions"))
    assert by_claims + by_reports == 12 and by_reports >= 8, (by_claims, by_reports)


def test_a_claim_whose_answer_was_lost_is_sent_again_with_its_key(node: Node, queue_name: str) -> None:
    transport = Recording(lose_claims=1)
    with Client(node.url, node.key, transport=transport) as client:
        [only] = ready(client, queue_name, [{"i": 0}])
        runs: list[Job] = []

        def once(job: Job) -> str:
            runs.append(job)
            return "once"

        worker = Worker(client, config(queue_name, concurrency=1, batch=1))
        t, out = in_thread(worker, once)
        wait_until("the occurrence runs", lambda: states(client, [only]) == ["SUCCEEDED"])
        report = stop(worker, t, out)
        o = client.get_occurrence(only)
    claims = transport.paths("/claim")
    assert claims[1]["claim_key"] == claims[0]["claim_key"] and claims[1].get("resent") is True
    assert "resent" not in claims[0]
    assert [(j.id, j.epoch) for j in runs] == [(only, 1)], "what the lost answer claimed, run once"
    assert report.completed == 1
    assert o.epoch == 1 and len(o.attempts or []) == 1


def test_the_async_worker_sends_a_lost_claim_again_and_runs_a_schedule(node: Node, queue_name: str) -> None:
    transport = AsyncRecording(lose_claims=1)

    async def go() -> tuple[WorkerReport, list[str]]:
        async with AsyncClient(node.url, node.key, transport=transport) as c:
            s = await c.create_schedule({"queue": queue_name, "cron": "* * * * * *", "payload": {"n": 1}})
            worker = AsyncWorker(c, config(queue_name, concurrency=2))

            async def handler(job: Job) -> dict[str, Any]:
                await asyncio.sleep(0.05)
                return {"seen": job.id, "payload": job.payload}

            run = asyncio.create_task(worker.run(handler))
            for _ in range(600):
                done = (await c.list_occurrences(schedule_id=s.id, state="SUCCEEDED")).occurrences
                if len(done) >= 2:
                    break
                await asyncio.sleep(0.05)
            worker.stop()
            report = await run
            await c.cancel_schedule(s.id)
            running = (await c.list_occurrences(schedule_id=s.id, state="RUNNING")).occurrences
            assert not running
            one = await c.get_occurrence(done[0].id)
            assert one.result == {"seen": one.id, "payload": {"n": 1}}
            return report, [o.id for o in done]

    report, done = asyncio.run(go())
    assert report.completed >= 2 and report.refused == report.lost == 0, report
    claims = transport.paths("/claim")
    assert claims[1]["claim_key"] == claims[0]["claim_key"] and claims[1].get("resent") is True


def test_a_lost_lease_stops_the_sync_handler(client: Client, queue_name: str) -> None:
    [only] = ready(client, queue_name, [{"i": 0}])
    stopped = threading.Event()

    def handler(job: Job) -> str:
        try:
            job.sleep(30)
        except LeaseLost:
            assert job.lease_lost
            stopped.set()
            raise
        return "never"

    # Renewals come after the 2 s lease has lapsed: it is lost, and the handler stopped.
    worker = Worker(client, config(queue_name, concurrency=1, lease_seconds=2, heartbeat=3))
    t, out = in_thread(worker, handler)
    wait_until("the worker claims", lambda: states(client, [only]) == ["RUNNING"])
    taken = wait_until("another worker takes the lapsed lease", lambda: client.claim(queue_name, "rescuer", lease_seconds=30), every=0.1)
    assert (taken[0].id, taken[0].epoch) == (only, 2)
    assert stopped.wait(10), "the handler is told its lease is lost"
    assert client.complete(only, "rescuer", 2, "rescued").accepted
    report = stop(worker, t, out)
    assert (report.lost, report.completed, report.refused) == (1, 0, 0), report
    assert client.get_occurrence(only).result == "rescued"


def test_a_lost_lease_cancels_the_async_handler(node: Node, queue_name: str) -> None:
    with node.client() as client:
        [only] = ready(client, queue_name, [{"i": 0}])
    cancelled = threading.Event()

    async def handler(job: Job) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def go() -> WorkerReport:
        async with AsyncClient(node.url, node.key) as c:
            worker = AsyncWorker(c, config(queue_name, concurrency=1, lease_seconds=2, heartbeat=3))
            run = asyncio.create_task(worker.run(handler))
            for _ in range(100):
                if (await c.get_occurrence(only)).state == "RUNNING":
                    break
                await asyncio.sleep(0.05)
            taken = []
            for _ in range(100):
                taken = await c.claim(queue_name, "rescuer", lease_seconds=30)
                if taken:
                    break
                await asyncio.sleep(0.1)
            assert [(x.id, x.epoch) for x in taken] == [(only, 2)]
            for _ in range(100):
                if cancelled.is_set():
                    break
                await asyncio.sleep(0.1)
            assert (await c.complete(only, "rescuer", 2, "rescued")).accepted
            worker.stop()
            return await run

    report = asyncio.run(go())
    assert cancelled.is_set(), "the handler's task is cancelled"
    assert (report.lost, report.completed, report.refused) == (1, 0, 0), report


def test_a_stalled_workers_late_completion_is_refused(client: Client, queue_name: str) -> None:
    [only] = ready(client, queue_name, [{"i": 0}])
    started, release = threading.Event(), threading.Event()

    def stalled(job: Job) -> str:
        started.set()
        release.wait(30)
        return "late"

    # A worker that stalls: no renewal reaches the server within its 2 s lease.
    cfg = config(queue_name, worker_id="stalled", concurrency=1, lease_seconds=2, heartbeat=60)
    worker = Worker(client, cfg)
    t, out = in_thread(worker, stalled)
    assert started.wait(10)
    taken = wait_until("another worker takes the lapsed lease", lambda: client.claim(queue_name, "rescuer", lease_seconds=30), every=0.1)
    assert client.complete(only, "rescuer", taken[0].epoch, "rescued").accepted
    # The stalled worker comes back and reports: refused, and counted so.
    release.set()
    report = stop(worker, t, out)
    assert (report.refused, report.completed) == (1, 0), report
    late = client.complete(only, "stalled", 1, "late again")
    assert (late.outcome, late.check) == ("conflict", "stale_epoch")
    o = client.get_occurrence(only)
    assert (o.state, o.epoch, o.result) == ("SUCCEEDED", 2, "rescued")
    assert [a.outcome for a in o.attempts or []] == ["lease_expired", "succeeded"]


class Child:
    """A worker process (`child_worker.py`), its output read line by line; killed when the
    test ends, passed or not."""

    def __init__(self, node: Node, queue_name: str, worker_id: str, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), node.url, node.key, queue_name, worker_id, mode],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def line(self, prefix: str, timeout: float = 30) -> str:
        """The next line that starts with `prefix`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the worker printed no {prefix!r} line within {timeout}s")
            if line is None:
                pytest.fail(f"the worker exited ({self.proc.wait()}) without a {prefix!r} line")
            if line.startswith(prefix):
                return line

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def test_a_sigkilled_worker_is_taken_over_at_epoch_2(node: Node, client: Client, queue_name: str) -> None:
    [only] = ready(client, queue_name, [{"i": 0}])
    with Child(node, queue_name, "doomed", "hang") as doomed:
        _, claimed_id, epoch = doomed.line("CLAIMED").split()
        assert (claimed_id, epoch) == (only, "1")
        doomed.proc.send_signal(signal.SIGKILL)
        assert doomed.proc.wait() == -signal.SIGKILL

    rescuer = Worker(client, config(queue_name, worker_id="rescuer"))
    t, out = in_thread(rescuer, lambda job: "rescued")
    o = wait_until("the killed worker's occurrence runs again", lambda: (lambda o: o if o.state == "SUCCEEDED" else None)(client.get_occurrence(only)))
    report = stop(rescuer, t, out)
    assert (o.epoch, o.result) == (2, "rescued"), "re-claimed under a new epoch"
    assert [a.outcome for a in o.attempts or []] == ["lease_expired", "succeeded"]
    assert report.completed == 1
    late = client.complete(only, "doomed", 1, "zombie")
    assert (late.outcome, late.check) == ("conflict", "stale_epoch")
    assert client.get_occurrence(only).result == "rescued"


@pytest.mark.parametrize("mode", ["slow", "slow-async"])
def test_sigterm_finishes_in_flight_work_and_leaves_nothing_running(
    node: Node, client: Client, queue_name: str, mode: str
) -> None:
    ids = ready(client, queue_name, [{"i": i} for i in range(5)])
    with Child(node, queue_name, f"graceful-{mode}", mode) as child:
        started = {child.line("STARTED").split()[1], child.line("STARTED").split()[1]}
        child.proc.send_signal(signal.SIGTERM)
        report = json.loads(child.line("REPORT", timeout=15).split(" ", 1)[1])
        assert child.proc.wait(15) == 0
    after = dict(zip(ids, states(client, ids)))
    assert "RUNNING" not in after.values(), after
    assert all(after[i] == "SUCCEEDED" for i in started), "in-flight handlers finished and reported"
    succeeded = [i for i, s in after.items() if s == "SUCCEEDED"]
    assert report["completed"] == len(succeeded) and report["lost"] == report["refused"] == 0, report
    # Nothing more was claimed once the signal came: the rest is still ready, never run.
    rest = [client.get_occurrence(i) for i in ids if i not in succeeded]
    assert all(o.state == "READY" and o.attempt_count == 0 for o in rest), rest
