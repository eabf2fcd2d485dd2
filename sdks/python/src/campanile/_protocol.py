"""What the blocking and the asyncio worker share: settings, the job handed to a handler, how
a handler's end becomes a report, how a refused or unanswered request is read, and what a
server older than this SDK refused."""

from __future__ import annotations

import enum
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .client import ClaimKey, Completion
from .errors import ApiError, CampanileError, ConfigError, TransportError
from .models import JSON, Claimed, Outcome

log = logging.getLogger("campanile.worker")


def default_worker_id() -> str:
    """`<host>-<pid>-<random>`: unique among live workers."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class WorkerConfig:
    """Worker settings. The lease is the server's: the worker asks for `lease_seconds` and
    renews every `heartbeat` seconds, and never judges from its own clock whether a lease
    still holds — the server's answer to a renewal or a report says so."""

    queue: str
    """The tenant's queue to claim from."""
    worker_id: str = field(default_factory=default_worker_id)
    """This worker's id (unique among live workers)."""
    concurrency: int = 8
    """Handlers running at once."""
    batch: int = 16
    """Most occurrences per claim."""
    lease_seconds: int = 30
    """Lease length asked for."""
    heartbeat: float | None = None
    """Seconds between renewals of every held lease (one call); default a third of the
    lease."""
    idle_poll: float = 0.25
    """Seconds between claims that found nothing."""
    recheck_refused: float = 60.0
    """Seconds the worker does without a field a server older than this SDK refused (a
    claim's key, a claim riding on a report) before sending it again: during a rolling
    upgrade the next request may reach an upgraded node."""

    def check(self) -> None:
        if self.concurrency < 1 or self.batch < 1 or self.lease_seconds < 1:
            raise ConfigError("concurrency, batch and lease_seconds must be positive")
        if self.heartbeat is not None and self.heartbeat <= 0:
            raise ConfigError("heartbeat must be positive")
        if not self.queue or not self.worker_id.strip():
            raise ConfigError("queue and worker_id must not be empty")

    @property
    def heartbeat_seconds(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease_seconds / 3


@dataclass
class WorkerReport:
    """What a worker did before it stopped."""

    completed: int = 0
    """Completions accepted."""
    failed: int = 0
    """Failures accepted."""
    lost: int = 0
    """Handlers stopped because their lease was lost (nothing reported)."""
    refused: int = 0
    """Outcomes the server refused (the lease had passed to a successor) or that could not
    be reported."""


class JobError(Exception):
    """A handler's failure of a known class: raise `TransientError` or `PermanentError`."""

    failure_class = "transient"


class TransientError(JobError):
    """Worth retrying: the occurrence runs again after a backoff while attempts remain. Any
    other exception a handler raises counts as this too."""

    failure_class = "transient"


class PermanentError(JobError):
    """Retrying cannot help: the occurrence becomes a dead letter (`DEAD`)."""

    failure_class = "permanent"


class LeaseLost(Exception):
    """Raised by `Job.check()` and `Job.sleep()` once the job's lease is lost: another worker
    may be running the occurrence now, and nothing this one does is reported."""


class Job:
    """One occurrence handed to a handler, with what it needs to know while it runs."""

    def __init__(self, claimed: Claimed, queue: str) -> None:
        self.id: str = claimed.id
        """The occurrence id: stable across retries and failovers, the idempotency key of
        any side effect."""
        self.schedule_id: str = claimed.schedule_id
        self.version: int = claimed.version
        self.queue: str = queue
        self.scheduled_for: datetime = claimed.scheduled_for
        self.attempt: int = claimed.attempt
        """Attempt number, 1-based."""
        self.epoch: int = claimed.epoch
        """The fencing token of this claim."""
        self.payload: JSON = claimed.payload
        """The schedule's payload."""
        self.claimed: Claimed = claimed
        self._lost = threading.Event()
        self._cancel = threading.Event()

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, epoch={self.epoch}, attempt={self.attempt})"

    @property
    def cancel_requested(self) -> bool:
        """Someone asked to cancel this occurrence (seen on the last heartbeat): check it
        before side effects."""
        return self._cancel.is_set()

    @property
    def lease_lost(self) -> bool:
        """The lease is lost: stop; whatever the handler returns is not reported."""
        return self._lost.is_set()

    def check(self) -> None:
        """Raises `LeaseLost` if the lease is lost: call it between steps of a long
        handler."""
        if self._lost.is_set():
            raise LeaseLost(f"occurrence {self.id}: lease of epoch {self.epoch} lost")

    def sleep(self, seconds: float) -> None:
        """Waits `seconds`, or raises `LeaseLost` as soon as the lease is lost (blocking
        handlers; an asyncio handler is cancelled instead)."""
        if self._lost.wait(seconds):
            raise LeaseLost(f"occurrence {self.id}: lease of epoch {self.epoch} lost")


class Done(enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    LOST = "lost"
    REFUSED = "refused"


def tally(report: WorkerReport, done: Done) -> None:
    if done is Done.COMPLETED:
        report.completed += 1
    elif done is Done.FAILED:
        report.failed += 1
    elif done is Done.LOST:
        report.lost += 1
    else:
        report.refused += 1


def outcome_of(job: Job, result: JSON = None, error: BaseException | None = None) -> tuple[Completion, Done]:
    """The report of a handler that returned `result` or raised `error`. A result that is
    not JSON is a permanent failure: sent again, it would not be either."""
    if error is None:
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as e:
            message = f"the handler's result is not JSON: {e}"
            log.error("occurrence %s: %s", job.id, message)
            return Completion.failure(job.id, job.epoch, "permanent", message), Done.FAILED
        return Completion.success(job.id, job.epoch, result), Done.COMPLETED
    if isinstance(error, JobError):
        return Completion.failure(job.id, job.epoch, error.failure_class, str(error)), Done.FAILED
    log.warning("occurrence %s: the handler raised %r; reported as transient", job.id, error)
    message = f"{type(error).__name__}: {error}"
    return Completion.failure(job.id, job.epoch, "transient", message), Done.FAILED


def no_answer(error: CampanileError) -> bool:
    """A request the server could not take (503) or that got no answer: sent again, it may
    land."""
    return isinstance(error, TransportError) or (isinstance(error, ApiError) and error.status == 503)


def key_after_failed_claim(
    key: ClaimKey | None, error: CampanileError, compat: Compat
) -> ClaimKey | None:
    """The key of the claim to make after one failed with `error`. It may have claimed before
    its answer was lost: sent again, it gets that. A refusal (4xx) claimed nothing, but the
    key may still hold what an earlier sending of it claimed: a key already sent again is
    kept."""
    if key is not None and key.resent:
        return key
    refused = isinstance(error, ApiError) and error.status < 500
    if key is not None and not refused:
        return key.again()
    return compat.key()


def judge(done: Done, sent_again: bool, results: list[Outcome]) -> Done:
    """How an answered report ended. A success sent again and refused because the
    occurrence is `SUCCEEDED` at this epoch was written by an earlier sending whose answer
    was lost (the fence checks epoch and owner before state); a failure sent again is not
    read this way, nor is `not_claimed`."""
    first = results[0] if results else None
    if first is not None and first.accepted:
        return done
    if (
        first is not None
        and sent_again
        and done is Done.COMPLETED
        and first.check == "wrong_state"
        and first.state == "SUCCEEDED"
    ):
        log.info("occurrence %s: outcome written by an earlier sending whose answer was lost", first.occurrence_id)
        return done
    check = first.check if first is not None else ""
    log.warning(
        "occurrence %s: outcome refused (%s): the lease had passed on",
        first.occurrence_id if first is not None else "?",
        check,
    )
    return Done.REFUSED


class _Refused:
    """When a field was last refused, if it is still being done without."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._lock = threading.Lock()

    def active(self, recheck: float) -> bool:
        with self._lock:
            if self._since is None:
                return False
            if time.monotonic() - self._since < recheck:
                return True
            self._since = None
            return False

    def refuse(self) -> None:
        with self._lock:
            self._since = time.monotonic()


class Compat:
    """What the server turned out not to take (it is older than this SDK), each learned from
    the 422 that refused it (nothing written); done without for `recheck` seconds, then
    tried again."""

    def __init__(self, recheck: float) -> None:
        self.recheck = recheck
        self.plain_reports = _Refused()
        self.unkeyed = _Refused()

    def key(self) -> ClaimKey | None:
        """A new key for the next claim, unless the server refused keys lately."""
        return None if self.unkeyed.active(self.recheck) else ClaimKey.new()

    def plain(self) -> bool:
        """Reports go without a claim (the server refused one lately)."""
        return self.plain_reports.active(self.recheck)

    def refused_key(self, error: CampanileError) -> bool:
        refused = (
            isinstance(error, ApiError)
            and error.status == 422
            and "unknown field `claim_key`" in error.message
        )
        if refused:
            log.info("the server takes no claim keys; claiming without for %ss", self.recheck)
            self.unkeyed.refuse()
        return refused

    def refused_claim(self, error: CampanileError) -> bool:
        refused = (
            isinstance(error, ApiError)
            and error.status == 422
            and "unknown field `claim`" in error.message
        )
        if refused:
            log.info("the server takes no claim with a report; reporting apart for %ss", self.recheck)
            self.plain_reports.refuse()
        return refused


def chunks(leases: list[tuple[str, int]], size: int = 1000) -> list[list[tuple[str, int]]]:
    return [leases[i : i + size] for i in range(0, len(leases), size)]


def describe(error: Any) -> str:
    return f"{type(error).__name__}: {error}"
