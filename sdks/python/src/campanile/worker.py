"""Workers: `Worker` runs blocking handlers on threads, `AsyncWorker` runs coroutine handlers
as asyncio tasks. Both speak the protocol the same way:

- a claim asks for up to `batch` occurrences (never more than free handler slots), under its
  own claim key; a claim that got no answer is sent again with the same key, marked
  `resent`, and gets what the first sending claimed instead of leaving it leased to nobody;
- each handler's outcome is reported with `POST /v1/completions`, and the same request claims
  the occurrence that takes its place (one round trip instead of two); a report the server
  could not take (503) or that got no answer is sent again, with backoff, for up to a lease;
- every held lease is renewed in one call per heartbeat; a lease reported lost stops its
  handler (an asyncio task is cancelled; a blocking handler sees `job.lease_lost`, and
  `job.check()` / `job.sleep()` raise `LeaseLost`) and its outcome is never reported;
- on SIGTERM or SIGINT (or `stop()`), the worker claims no more, lets in-flight handlers
  finish under renewed leases, reports their outcomes without claiming, runs what a report
  claimed just before, and returns: nothing it leased is left `RUNNING`.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Union

from ._protocol import (
    Compat,
    Done,
    Job,
    JobError,
    LeaseLost,
    PermanentError,
    TransientError,
    WorkerConfig,
    WorkerReport,
    chunks,
    describe,
    judge,
    key_after_failed_claim,
    log,
    no_answer,
    outcome_of,
    tally,
)
from .client import AsyncClient, ClaimNext, Client, Completion
from .errors import CampanileError
from .models import JSON, Claimed, Reported

__all__ = [
    "AsyncWorker",
    "Job",
    "JobError",
    "LeaseLost",
    "PermanentError",
    "TransientError",
    "Worker",
    "WorkerConfig",
    "WorkerReport",
]

Handler = Callable[[Job], JSON]
AsyncHandler = Callable[[Job], Union[Awaitable[JSON], JSON]]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The longest the blocking worker's main thread waits before it looks whether a signal asked
# it to stop (a signal handler only sets a flag: see `Worker._install_signals`).
_SLICE = 0.1
_RUNNING, _REPORTING, _LOST = "running", "reporting", "lost"


@dataclass
class _Finished:
    """A handler slot freed: the job ended (`done`), with what its report claimed."""

    key: tuple[str, int]
    done: Done
    next: list[Claimed]


class _Held:
    """A lease this worker holds for a running job, until its outcome is reported."""

    __slots__ = ("job", "state", "lock")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.state = _RUNNING
        self.lock = threading.Lock()


class Worker:
    """Runs a blocking handler over one queue, each job on a thread of its own.

    The handler takes a `Job` and returns the result (any JSON value), or raises
    `TransientError` / `PermanentError` (any other exception counts as transient). A thread
    cannot be stopped from outside: a handler that runs long checks `job.lease_lost`, or
    calls `job.check()` or `job.sleep()`, which raise `LeaseLost` once the lease is lost;
    whatever it returns then is not reported. A worker runs once.
    """

    def __init__(self, client: Client, config: WorkerConfig) -> None:
        self.client = client
        self.config = config
        self._compat = Compat(config.recheck_refused)
        self._stopping = threading.Event()
        self._signaled: int | None = None
        self._events: queue.Queue[_Finished | None] = queue.Queue()
        self._held: dict[str, _Held] = {}
        self._held_lock = threading.Lock()

    def stop(self) -> None:
        """Asks the worker to stop gracefully, from any thread (not from a signal handler of
        your own: it takes locks the interrupted thread may hold; `run` handles SIGTERM and
        SIGINT itself)."""
        self._stopping.set()
        self._events.put(None)

    def _stop_noticed(self) -> bool:
        """Whether the worker is stopping, taking in a signal that asked it to."""
        signum = self._signaled
        if signum is not None and not self._stopping.is_set():
            log.info("%s: stopping; in-flight handlers finish", signal.Signals(signum).name)
            self._stopping.set()
        return self._stopping.is_set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self, handler: Handler, *, handle_signals: bool = True) -> WorkerReport:
        """Claims and runs until `stop()` (or SIGTERM/SIGINT when `handle_signals` and this is
        the main thread), then stops gracefully and returns what it did. A second SIGINT
        while stopping raises `KeyboardInterrupt`."""
        cfg = self.config
        cfg.check()
        report = WorkerReport()
        active: set[tuple[str, int]] = set()
        beat_stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(beat_stop,), name="campanile-heartbeat", daemon=True
        )
        beat.start()
        restore = self._install_signals() if handle_signals else {}
        try:
            # The key of the claim to make next: kept, marked sent again, when a claim got no
            # answer, so that what it may have claimed comes back.
            key = self._compat.key()
            while not self._stop_noticed():
                free = cfg.concurrency - len(active)
                got = 0
                if free > 0:
                    try:
                        claimed = self.client.claim(
                            cfg.queue,
                            cfg.worker_id,
                            max_count=min(cfg.batch, free),
                            lease_seconds=cfg.lease_seconds,
                            claim_key=key,
                        )
                    except CampanileError as e:
                        if self._compat.refused_key(e):
                            key = None
                        else:
                            log.warning("claim failed; retrying: %s", e)
                            key = key_after_failed_claim(key, e, self._compat)
                            self._pause(1.0)
                    else:
                        got = len(claimed)
                        self._start(claimed, handler, active)
                        key = self._compat.key()
                self._collect(report, handler, active, wait=False)
                if got == 0 or len(active) >= cfg.concurrency:
                    idle = cfg.idle_poll if len(active) < cfg.concurrency else None
                    self._collect(report, handler, active, wait=True, timeout=idle, until_stop=True)
            # Graceful: no more claims; in-flight handlers finish under renewed leases, and
            # what a report claimed just before is run too (it is leased here).
            while active:
                self._collect(report, handler, active, wait=True, timeout=None)
        finally:
            beat_stop.set()
            beat.join()
            for signum, previous in restore.items():
                signal.signal(signum, previous)
        return report

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        # A handler runs in the main thread between two of its bytecodes, maybe while it
        # holds a lock (the queue's, an Event's): it takes none itself, it only sets a flag
        # that the main thread looks at at least every `_SLICE` seconds.
        def on_signal(signum: int, _frame: object) -> None:
            if self._signaled is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self._signaled = signum

        restore: dict[int, Any] = {}
        for signum in _SIGNALS:
            previous = signal.signal(signum, on_signal)
            restore[signum] = signal.SIG_DFL if previous is None else previous
        return restore

    def _collect(
        self,
        report: WorkerReport,
        handler: Handler,
        active: set[tuple[str, int]],
        *,
        wait: bool,
        timeout: float | None = None,
        until_stop: bool = False,
    ) -> None:
        """Counts the jobs that ended and starts what their reports claimed: all that have
        ended, after waiting (with `wait`) for one, for `timeout` at most (None: no limit),
        or (with `until_stop`) until the worker is asked to stop."""
        event = self._wait(timeout, until_stop) if wait else None
        while True:
            if event is not None:
                active.discard(event.key)
                tally(report, event.done)
                self._start(event.next, handler, active)
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return

    def _wait(self, timeout: float | None, until_stop: bool) -> _Finished | None:
        """The next job that ends, or None after `timeout` or once asked to stop."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if until_stop and self._stop_noticed():
                return None
            left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
            if left <= 0:
                return None
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                continue
            if event is not None:
                return event

    def _pause(self, seconds: float) -> None:
        """Waits `seconds`, or less once asked to stop."""
        deadline = time.monotonic() + seconds
        while not self._stop_noticed():
            left = min(_SLICE, deadline - time.monotonic())
            if left <= 0:
                return
            self._stopping.wait(left)

    def _start(self, claimed: list[Claimed], handler: Handler, active: set[tuple[str, int]]) -> None:
        for c in claimed:
            with self._held_lock:
                held = self._held.get(c.id)
                # A claim sent again can answer what the first sending claimed: not twice.
                if held is not None and held.job.epoch == c.epoch:
                    log.info("occurrence %s epoch %s claimed twice; already running", c.id, c.epoch)
                    continue
                held = _Held(Job(c, self.config.queue))
                self._held[c.id] = held
            active.add((c.id, c.epoch))
            threading.Thread(
                target=self._run_one,
                args=(held, handler),
                name=f"campanile-job-{c.id}",
                daemon=True,
            ).start()

    def _release(self, held: _Held) -> None:
        """Stops renewing this claim's lease — this claim's only: the occurrence may have
        been claimed again here under a later epoch."""
        with self._held_lock:
            current = self._held.get(held.job.id)
            if current is held:
                del self._held[held.job.id]

    def _run_one(self, held: _Held, handler: Handler) -> None:
        job = held.job
        outcome: tuple[Completion, Done] | None
        try:
            outcome = outcome_of(job, handler(job))
        except LeaseLost:
            outcome = None
        except Exception as e:  # noqa: BLE001 - any failure of the handler is reported
            outcome = outcome_of(job, error=e)
        with held.lock:
            if held.state == _LOST:
                return  # the heartbeat freed the slot and counted it
            held.state = _REPORTING if outcome is not None else _LOST
        done: Done = Done.LOST
        claimed: list[Claimed] = []
        try:
            if outcome is not None:
                done, claimed = self._report(job, *outcome)
        except Exception as e:  # noqa: BLE001 - the slot must be freed whatever happens
            log.error("occurrence %s: reporting failed: %s", job.id, describe(e))
            done, claimed = Done.REFUSED, []
        finally:
            self._release(held)
            self._events.put(_Finished((job.id, job.epoch), done, claimed))

    def _lose(self, held: _Held) -> None:
        """The server says the lease is lost: the handler is told, its slot freed, and
        nothing it returns is reported."""
        with held.lock:
            held.job._lost.set()
            if held.state != _RUNNING:
                return  # already reporting: the fence decides
            held.state = _LOST
        log.warning("occurrence %s: lease lost; handler stopped, no outcome reported", held.job.id)
        self._release(held)
        self._events.put(_Finished((held.job.id, held.job.epoch), Done.LOST, []))

    def _report(self, job: Job, item: Completion, done: Done) -> tuple[Done, list[Claimed]]:
        """Reports one outcome; unless the worker is stopping, the report also claims the
        occurrence that takes this one's place."""
        cfg = self.config
        give_up = time.monotonic() + cfg.lease_seconds
        delay = 0.1
        sent_again = False
        key = self._compat.key()
        # Whether a sending carried a claim: sent again, it keeps it even once stopping
        # began, so that what the first sending may have claimed comes back and is run.
        claim_sent = False
        while True:
            resending_claim = sent_again and claim_sent and key is not None
            error: CampanileError | None = None
            answer: Reported | None = None
            with_claim = not (
                (self._stopping.is_set() and not resending_claim) or self._compat.plain()
            )
            try:
                if with_claim:
                    claim_sent = True
                    answer = self.client.completions(
                        cfg.worker_id,
                        [item],
                        claim=ClaimNext(cfg.queue, 1, cfg.lease_seconds, key),
                    )
                else:
                    answer = self.client.completions(cfg.worker_id, [item])
            except CampanileError as e:
                # A server older than this SDK refuses the field (nothing was written).
                if with_claim and self._compat.refused_claim(e):
                    continue
                if with_claim and self._compat.refused_key(e):
                    key = None
                    continue
                error = e
            if answer is not None:
                return judge(done, sent_again, answer.results), answer.claimed
            assert error is not None
            if not no_answer(error) or time.monotonic() + delay >= give_up:
                # The lease will end and another worker will run it again (at least once).
                log.warning("occurrence %s: could not report the outcome: %s", job.id, error)
                return Done.REFUSED, []
            log.warning("occurrence %s: reporting the outcome failed; retrying: %s", job.id, error)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            sent_again = True
            # Its claim may have been made: sent again, it answers what it claimed.
            key = key.again() if key is not None else None

    def _heartbeat(self, stop: threading.Event) -> None:
        cfg = self.config
        while not stop.wait(cfg.heartbeat_seconds):
            with self._held_lock:
                leases = [(i, h.job.epoch) for i, h in self._held.items()]
            for chunk in chunks(leases):
                try:
                    renewals = self.client.renew(
                        cfg.worker_id, chunk, lease_seconds=cfg.lease_seconds
                    )
                except CampanileError as e:
                    log.warning("lease renewal failed; will retry: %s", e)
                    continue
                except Exception as e:  # noqa: BLE001 - the heartbeat must go on
                    log.error("lease renewal failed: %s", describe(e))
                    continue
                for r in renewals:
                    with self._held_lock:
                        held = self._held.get(r.occurrence_id)
                    if held is None or held.job.epoch != r.epoch:
                        continue
                    if r.cancel_requested:
                        held.job._cancel.set()
                    if not r.renewed:
                        self._lose(held)


class _AsyncHeld:
    __slots__ = ("job", "lost")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.lost = asyncio.Event()


class AsyncWorker:
    """Runs a coroutine handler over one queue, each job an asyncio task.

    The handler takes a `Job` and returns the result (any JSON value), or raises
    `TransientError` / `PermanentError` (any other exception counts as transient). A lost
    lease cancels the handler's task (`asyncio.CancelledError` is raised at its `await`);
    whatever it did is not reported. A worker runs once.
    """

    def __init__(self, client: AsyncClient, config: WorkerConfig) -> None:
        self.client = client
        self.config = config
        self._compat = Compat(config.recheck_refused)
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._held: dict[str, _AsyncHeld] = {}

    def stop(self) -> None:
        """Asks the worker to stop gracefully (from its loop, or from another thread)."""
        self._stopping = True
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            wake.set()
        else:
            loop.call_soon_threadsafe(wake.set)

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def run(self, handler: AsyncHandler, *, handle_signals: bool = True) -> WorkerReport:
        """Claims and runs until `stop()` (or SIGTERM/SIGINT when `handle_signals`), then
        stops gracefully and returns what it did."""
        cfg = self.config
        cfg.check()
        loop = asyncio.get_running_loop()
        self._loop, self._wake = loop, asyncio.Event()
        if self._stopping:
            self._wake.set()
        report = WorkerReport()
        tasks: set[asyncio.Task[tuple[Done, list[Claimed]]]] = set()
        beat_stop = asyncio.Event()
        beat = asyncio.create_task(self._heartbeat(beat_stop))
        installed = self._install_signals(loop) if handle_signals else []
        try:
            key = self._compat.key()
            while not self._stopping:
                free = cfg.concurrency - len(tasks)
                got = 0
                if free > 0:
                    try:
                        claimed = await self.client.claim(
                            cfg.queue,
                            cfg.worker_id,
                            max_count=min(cfg.batch, free),
                            lease_seconds=cfg.lease_seconds,
                            claim_key=key,
                        )
                    except CampanileError as e:
                        if self._compat.refused_key(e):
                            key = None
                        else:
                            log.warning("claim failed; retrying: %s", e)
                            key = key_after_failed_claim(key, e, self._compat)
                            await self._pause(1.0)
                    else:
                        got = len(claimed)
                        self._start(claimed, handler, tasks)
                        key = self._compat.key()
                for t in [t for t in tasks if t.done()]:
                    self._collect(t, report, handler, tasks)
                if got == 0 or len(tasks) >= cfg.concurrency:
                    idle = cfg.idle_poll if len(tasks) < cfg.concurrency else None
                    wake = asyncio.ensure_future(self._wake.wait())
                    try:
                        woke, _ = await asyncio.wait(
                            {*tasks, wake}, timeout=idle, return_when=asyncio.FIRST_COMPLETED
                        )
                    finally:
                        wake.cancel()
                    for t in [t for t in tasks if t in woke]:
                        self._collect(t, report, handler, tasks)
            # Graceful: no more claims; in-flight handlers finish under renewed leases, and
            # what a report claimed just before is run too.
            while tasks:
                ended, _ = await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
                for t in ended:
                    self._collect(t, report, handler, tasks)
        finally:
            beat_stop.set()
            await beat
            for signum in installed:
                loop.remove_signal_handler(signum)
        return report

    async def _pause(self, seconds: float) -> None:
        assert self._wake is not None
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        def on_signal(signum: int) -> None:
            if self._stopping and signum == signal.SIGINT:
                raise KeyboardInterrupt
            log.info("%s: stopping; in-flight handlers finish", signal.Signals(signum).name)
            self.stop()

        installed: list[int] = []
        for signum in _SIGNALS:
            try:
                loop.add_signal_handler(signum, on_signal, signum)
            except (NotImplementedError, RuntimeError, ValueError):
                continue  # not the main thread, or a platform without them
            installed.append(signum)
        return installed

    def _collect(
        self,
        task: asyncio.Task[tuple[Done, list[Claimed]]],
        report: WorkerReport,
        handler: AsyncHandler,
        tasks: set[asyncio.Task[tuple[Done, list[Claimed]]]],
    ) -> None:
        tasks.discard(task)
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:
            log.error("a job's task failed: %s", describe(err))
            return
        done, claimed = task.result()
        tally(report, done)
        self._start(claimed, handler, tasks)

    def _start(
        self,
        claimed: list[Claimed],
        handler: AsyncHandler,
        tasks: set[asyncio.Task[tuple[Done, list[Claimed]]]],
    ) -> None:
        for c in claimed:
            held = self._held.get(c.id)
            if held is not None and held.job.epoch == c.epoch:
                log.info("occurrence %s epoch %s claimed twice; already running", c.id, c.epoch)
                continue
            held = _AsyncHeld(Job(c, self.config.queue))
            self._held[c.id] = held
            tasks.add(asyncio.create_task(self._run_one(held, handler), name=f"campanile-job-{c.id}"))

    async def _run_one(self, held: _AsyncHeld, handler: AsyncHandler) -> tuple[Done, list[Claimed]]:
        job = held.job
        try:
            outcome = await self._race(held, handler)
            if outcome is None:
                log.warning("occurrence %s: lease lost; handler stopped, no outcome reported", job.id)
                return Done.LOST, []
            return await self._report(job, *outcome)
        finally:
            if self._held.get(job.id) is held:
                del self._held[job.id]

    async def _race(
        self, held: _AsyncHeld, handler: AsyncHandler
    ) -> tuple[Completion, Done] | None:
        """The handler's outcome, or None when the lease was lost first (the handler's task
        is then cancelled)."""
        job = held.job
        try:
            produced = handler(job)
        except LeaseLost:
            return None
        except Exception as e:  # noqa: BLE001 - any failure of the handler is reported
            return outcome_of(job, error=e)
        if not inspect.isawaitable(produced):
            return outcome_of(job, produced)
        run: asyncio.Future[Any] = asyncio.ensure_future(produced)
        lost = asyncio.ensure_future(held.lost.wait())
        try:
            await asyncio.wait({run, lost}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            run.cancel()
            raise
        finally:
            lost.cancel()
        if not run.done():
            run.cancel()
            run.add_done_callback(_quiet)
            return None
        if run.cancelled():
            return None if held.lost.is_set() else outcome_of(
                job, error=TransientError("the handler's task was cancelled")
            )
        err = run.exception()
        if err is None:
            return outcome_of(job, run.result())
        if isinstance(err, LeaseLost):
            return None
        return outcome_of(job, error=err)

    async def _report(self, job: Job, item: Completion, done: Done) -> tuple[Done, list[Claimed]]:
        cfg = self.config
        give_up = time.monotonic() + cfg.lease_seconds
        delay = 0.1
        sent_again = False
        key = self._compat.key()
        claim_sent = False
        while True:
            resending_claim = sent_again and claim_sent and key is not None
            error: CampanileError | None = None
            answer: Reported | None = None
            with_claim = not (
                (self._stopping and not resending_claim) or self._compat.plain()
            )
            try:
                if with_claim:
                    claim_sent = True
                    answer = await self.client.completions(
                        cfg.worker_id,
                        [item],
                        claim=ClaimNext(cfg.queue, 1, cfg.lease_seconds, key),
                    )
                else:
                    answer = await self.client.completions(cfg.worker_id, [item])
            except CampanileError as e:
                # A server older than this SDK refuses the field (nothing was written).
                if with_claim and self._compat.refused_claim(e):
                    continue
                if with_claim and self._compat.refused_key(e):
                    key = None
                    continue
                error = e
            if answer is not None:
                return judge(done, sent_again, answer.results), answer.claimed
            assert error is not None
            if not no_answer(error) or time.monotonic() + delay >= give_up:
                log.warning("occurrence %s: could not report the outcome: %s", job.id, error)
                return Done.REFUSED, []
            log.warning("occurrence %s: reporting the outcome failed; retrying: %s", job.id, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            sent_again = True
            key = key.again() if key is not None else None

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        cfg = self.config
        while True:
            try:
                await asyncio.wait_for(stop.wait(), cfg.heartbeat_seconds)
                return
            except asyncio.TimeoutError:
                pass
            leases = [(i, h.job.epoch) for i, h in self._held.items()]
            for chunk in chunks(leases):
                try:
                    renewals = await self.client.renew(
                        cfg.worker_id, chunk, lease_seconds=cfg.lease_seconds
                    )
                except CampanileError as e:
                    log.warning("lease renewal failed; will retry: %s", e)
                    continue
                except Exception as e:  # noqa: BLE001 - the heartbeat must go on
                    log.error("lease renewal failed: %s", describe(e))
                    continue
                for r in renewals:
                    held = self._held.get(r.occurrence_id)
                    if held is None or held.job.epoch != r.epoch:
                        continue
                    if r.cancel_requested:
                        held.job._cancel.set()
                    if not r.renewed:
                        held.job._lost.set()
                        held.lost.set()


def _quiet(future: asyncio.Future[Any]) -> None:
    """Reads a cancelled handler's end, so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()
