"""The API's answers as typed records.

Instants are timezone-aware `datetime`s in UTC (the API's own are RFC 3339 with nanoseconds;
a `datetime` keeps microseconds). Payloads and results are JSON as `json.loads` reads it:
integers of any size are kept exactly, decimals become `float`. Each record also keeps the
JSON object it was read from in `raw`, for fields this version of the SDK does not name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

from .errors import DecodeError

JSON = Any
"""Any JSON value: a dict, list, str, int, float, bool or None."""

_FRACTION = re.compile(r"\.(\d+)")


def parse_instant(text: str) -> datetime:
    """An RFC 3339 instant (`2026-12-04T07:48:00.123456789Z`) as an aware `datetime` in UTC."""
    s = text.strip()
    if s[-1:] in ("Z", "z"):
        s = s[:-1] + "+00:00"
    m = _FRACTION.search(s)
    if m:
        s = s[: m.start()] + "." + m.group(1)[:6].ljust(6, "0") + s[m.end() :]
    try:
        value = datetime.fromisoformat(s)
    except ValueError as e:
        raise DecodeError(f"not an RFC 3339 instant: {text!r}") from e
    if value.tzinfo is None:
        raise DecodeError(f"an instant without an offset: {text!r}")
    return value.astimezone(timezone.utc)


def format_instant(value: datetime | str) -> str:
    """An instant as the API takes it (RFC 3339 in UTC); a `str` is passed as given. A naive
    `datetime` is refused: which zone it meant is unknown."""
    if isinstance(value, str):
        return value
    if value.tzinfo is None:
        raise ValueError("a naive datetime has no zone: give an aware one (e.g. in UTC)")
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _obj(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise DecodeError(f"{what}: expected a JSON object, got {value!r}")
    return value


def _req(d: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return d[key]
    except KeyError:
        raise DecodeError(f"{what}: no {key!r} in {dict(d)!r}") from None


def _at(d: Mapping[str, Any], key: str, what: str) -> datetime:
    value = _req(d, key, what)
    if not isinstance(value, str):
        raise DecodeError(f"{what}.{key}: expected an instant, got {value!r}")
    return parse_instant(value)


def _opt_at(d: Mapping[str, Any], key: str) -> datetime | None:
    value = d.get(key)
    return parse_instant(value) if isinstance(value, str) else None


@dataclass(frozen=True)
class Claimed:
    """An occurrence a claim handed to a worker, under a lease."""

    id: str
    """The occurrence id: stable across retries and failovers, the idempotency key of the
    work."""
    schedule_id: str
    version: int
    scheduled_for: datetime
    epoch: int
    """The fencing token: sent back with every renewal and report."""
    lease_until: datetime
    """The lease's end, on the server's clock."""
    attempt: int
    payload: JSON
    available_at: datetime | None = None
    claimed_at: datetime | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, value: Any) -> Claimed:
        d = _obj(value, "claimed occurrence")
        return cls(
            id=str(_req(d, "id", "claimed")),
            schedule_id=str(_req(d, "schedule_id", "claimed")),
            version=int(_req(d, "version", "claimed")),
            scheduled_for=_at(d, "scheduled_for", "claimed"),
            epoch=int(_req(d, "epoch", "claimed")),
            lease_until=_at(d, "lease_until", "claimed"),
            attempt=int(_req(d, "attempt", "claimed")),
            payload=d.get("payload"),
            available_at=_opt_at(d, "available_at"),
            claimed_at=_opt_at(d, "claimed_at"),
            raw=d,
        )


@dataclass(frozen=True)
class Renewal:
    """One lease's renewal result."""

    occurrence_id: str
    epoch: int
    renewed: bool
    """False: the lease is lost; the work must stop."""
    lease_until: datetime | None
    cancel_requested: bool
    check: str | None = None
    message: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> Renewal:
        d = _obj(value, "renewal")
        return cls(
            occurrence_id=str(_req(d, "occurrence_id", "renewal")),
            epoch=int(_req(d, "epoch", "renewal")),
            renewed=bool(_req(d, "renewed", "renewal")),
            lease_until=_opt_at(d, "lease_until"),
            cancel_requested=bool(d.get("cancel_requested", False)),
            check=d.get("check"),
            message=d.get("message"),
        )


@dataclass(frozen=True)
class Outcome:
    """The answer to one fenced write (a completion, a failure, a redrive, a cancel):
    `accepted`, or `conflict` with the check that refused it."""

    occurrence_id: str
    outcome: str
    """`accepted` or `conflict`."""
    state: str | None = None
    """After an accepted write, the state it left; for a `wrong_state` or `not_claimed`
    conflict, the state the occurrence is in."""
    retry_at: datetime | None = None
    check: str | None = None
    """For conflicts: `stale_epoch`, `not_owner`, `lease_expired` and `not_claimed` mean the
    lease is not the caller's; `wrong_state` means the caller's claim of this epoch has ended
    otherwise (`state` says how)."""
    message: str | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome == "accepted"

    @classmethod
    def from_json(cls, value: Any) -> Outcome:
        d = _obj(value, "outcome")
        return cls(
            occurrence_id=str(_req(d, "occurrence_id", "outcome")),
            outcome=str(_req(d, "outcome", "outcome")),
            state=d.get("state"),
            retry_at=_opt_at(d, "retry_at"),
            check=d.get("check"),
            message=d.get("message"),
        )


@dataclass(frozen=True)
class Reported:
    """The answer to a batch of outcomes: one `Outcome` per item, in order, and what the
    claim riding on it claimed (empty without one)."""

    results: list[Outcome]
    claimed: list[Claimed]
    claimed_truncated: bool = False


@dataclass(frozen=True)
class Schedule:
    """A schedule as the API shows it."""

    id: str
    version: int
    state: str
    """`ACTIVE`, `PAUSED`, `CANCELED` or `FINISHED`."""
    queue: str
    payload: JSON
    priority: int
    lease_seconds: int
    overlap: str
    flex_window_seconds: int
    misfire: Mapping[str, Any]
    retry: Mapping[str, Any]
    next_fires: list[datetime]
    created_at: datetime
    updated_at: datetime
    cron: str | None = None
    timezone: str | None = None
    dst: Mapping[str, Any] | None = None
    at: datetime | None = None
    every: str | None = None
    anchor: datetime | None = None
    target: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, value: Any) -> Schedule:
        d = _obj(value, "schedule")
        return cls(
            id=str(_req(d, "id", "schedule")),
            version=int(_req(d, "version", "schedule")),
            state=str(_req(d, "state", "schedule")),
            queue=str(_req(d, "queue", "schedule")),
            payload=d.get("payload"),
            priority=int(d.get("priority", 0)),
            lease_seconds=int(d.get("lease_seconds", 30)),
            overlap=str(d.get("overlap", "ALLOW")),
            flex_window_seconds=int(d.get("flex_window_seconds", 0)),
            misfire=d.get("misfire") or {},
            retry=d.get("retry") or {},
            next_fires=[parse_instant(t) for t in d.get("next_fires", [])],
            created_at=_at(d, "created_at", "schedule"),
            updated_at=_at(d, "updated_at", "schedule"),
            cron=d.get("cron"),
            timezone=d.get("timezone"),
            dst=d.get("dst"),
            at=_opt_at(d, "at"),
            every=d.get("every"),
            anchor=_opt_at(d, "anchor"),
            target=d.get("target"),
            raw=d,
        )


@dataclass(frozen=True)
class InFlight:
    """An occurrence of an older version a worker still holds, reported by a change."""

    id: str
    state: str


@dataclass(frozen=True)
class ScheduleChange:
    """The answer to an update, pause, resume or cancel."""

    schedule: Schedule
    canceled: int
    """Occurrences of older versions no worker held that became `CANCELED`."""
    in_flight: list[InFlight]
    """Running occurrences of older versions, left to their workers."""

    @classmethod
    def from_json(cls, value: Any) -> ScheduleChange:
        d = _obj(value, "schedule change")
        return cls(
            schedule=Schedule.from_json(_req(d, "schedule", "schedule change")),
            canceled=int(d.get("canceled", 0)),
            in_flight=[
                InFlight(id=str(i["id"]), state=str(i["state"])) for i in d.get("in_flight", [])
            ],
        )


@dataclass(frozen=True)
class SchedulePage:
    """A page of schedules; `next_cursor` continues it (None on the last page)."""

    schedules: list[Schedule]
    next_cursor: str | None
    truncated: bool = False

    @classmethod
    def from_json(cls, value: Any) -> SchedulePage:
        d = _obj(value, "schedule list")
        return cls(
            schedules=[Schedule.from_json(s) for s in _req(d, "schedules", "schedule list")],
            next_cursor=d.get("next_cursor"),
            truncated=bool(d.get("truncated", False)),
        )


@dataclass(frozen=True)
class Attempt:
    """One claim of an occurrence and how it ended."""

    epoch: int
    worker_id: str
    started_at: datetime
    lease_until: datetime
    finished_at: datetime | None
    outcome: str
    """`running`, `succeeded`, `failed` or `lease_expired`."""
    error_class: str | None = None
    error_message: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> Attempt:
        d = _obj(value, "attempt")
        return cls(
            epoch=int(_req(d, "epoch", "attempt")),
            worker_id=str(_req(d, "worker_id", "attempt")),
            started_at=_at(d, "started_at", "attempt"),
            lease_until=_at(d, "lease_until", "attempt"),
            finished_at=_opt_at(d, "finished_at"),
            outcome=str(_req(d, "outcome", "attempt")),
            error_class=d.get("error_class"),
            error_message=d.get("error_message"),
        )


@dataclass(frozen=True)
class Occurrence:
    """An occurrence as the API shows it; `attempts` only on single reads."""

    id: str
    schedule_id: str
    version: int
    scheduled_for: datetime
    available_at: datetime
    state: str
    """`SCHEDULED`, `READY`, `RUNNING`, `SUCCEEDED`, `RETRY_WAIT`, `DEAD`, `MISSED`,
    `CANCELED` or `SKIPPED_OVERLAP`."""
    epoch: int
    owner: str | None
    lease_until: datetime | None
    attempt_count: int
    max_attempts: int
    cancel_requested: bool
    result: JSON
    origin: str
    """`planned`, `manual` or `backfill`."""
    last_error: str | None = None
    finished_at: datetime | None = None
    attempts: list[Attempt] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, value: Any) -> Occurrence:
        d = _obj(value, "occurrence")
        attempts = d.get("attempts")
        return cls(
            id=str(_req(d, "id", "occurrence")),
            schedule_id=str(_req(d, "schedule_id", "occurrence")),
            version=int(_req(d, "version", "occurrence")),
            scheduled_for=_at(d, "scheduled_for", "occurrence"),
            available_at=_at(d, "available_at", "occurrence"),
            state=str(_req(d, "state", "occurrence")),
            epoch=int(_req(d, "epoch", "occurrence")),
            owner=d.get("owner"),
            lease_until=_opt_at(d, "lease_until"),
            attempt_count=int(d.get("attempt_count", 0)),
            max_attempts=int(d.get("max_attempts", 0)),
            cancel_requested=bool(d.get("cancel_requested", False)),
            result=d.get("result"),
            origin=str(d.get("origin", "planned")),
            last_error=d.get("last_error"),
            finished_at=_opt_at(d, "finished_at"),
            attempts=None if attempts is None else [Attempt.from_json(a) for a in attempts],
            raw=d,
        )


@dataclass(frozen=True)
class OccurrencePage:
    """A page of occurrences; `next_cursor` continues it (None on the last page)."""

    occurrences: list[Occurrence]
    next_cursor: str | None
    truncated: bool = False

    @classmethod
    def from_json(cls, value: Any) -> OccurrencePage:
        d = _obj(value, "occurrence list")
        return cls(
            occurrences=[
                Occurrence.from_json(o) for o in _req(d, "occurrences", "occurrence list")
            ],
            next_cursor=d.get("next_cursor"),
            truncated=bool(d.get("truncated", False)),
        )


@dataclass(frozen=True)
class Backfill:
    """What a backfill made and found."""

    backfill_id: str
    schedule_id: str
    version: int
    start: datetime
    """The range's start (the API's `from`)."""
    end: datetime
    """The range's end, excluded (the API's `to`)."""
    instants: int
    created: list[Occurrence]
    rerun: list[Occurrence]
    existing: list[Occurrence]
    replayed: bool

    @classmethod
    def from_json(cls, value: Any) -> Backfill:
        d = _obj(value, "backfill")
        return cls(
            backfill_id=str(_req(d, "backfill_id", "backfill")),
            schedule_id=str(_req(d, "schedule_id", "backfill")),
            version=int(_req(d, "version", "backfill")),
            start=_at(d, "from", "backfill"),
            end=_at(d, "to", "backfill"),
            instants=int(d.get("instants", 0)),
            created=[Occurrence.from_json(o) for o in d.get("created", [])],
            rerun=[Occurrence.from_json(o) for o in d.get("rerun", [])],
            existing=[Occurrence.from_json(o) for o in d.get("existing", [])],
            replayed=bool(d.get("replayed", False)),
        )
