"""Typed clients of one tenant's API: `Client` (blocking) and `AsyncClient` (asyncio), with
the same methods. Both are built on `httpx`; one client may be shared by many threads
(`Client`) or tasks (`AsyncClient`).
"""

from __future__ import annotations

import json
import ssl
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Mapping, Sequence, TypeVar
from urllib.parse import quote

import httpx

from .errors import ApiError, ConfigError, DecodeError, TransportError
from .models import (
    JSON,
    Backfill,
    Claimed,
    Occurrence,
    OccurrencePage,
    Outcome,
    Renewal,
    Reported,
    Schedule,
    ScheduleChange,
    SchedulePage,
    format_instant,
)

T = TypeVar("T")

DEFAULT_TIMEOUT = 30.0
"""Seconds one request may take, answer included."""


@dataclass(frozen=True)
class ClaimKey:
    """A claim's own key. Make a new one (`ClaimKey.new()`) for each claim meant; should a
    claim get no answer (a broken connection, a timeout), send it again with `key.again()`:
    the server then answers what the first sending claimed, if it did and the worker still
    holds it, instead of claiming more work that nobody would run until its lease ends."""

    id: uuid.UUID
    resent: bool = False

    @classmethod
    def new(cls) -> ClaimKey:
        return cls(id=uuid.uuid4())

    def again(self) -> ClaimKey:
        """The same key, for the same claim sent again."""
        return ClaimKey(id=self.id, resent=True)

    def write(self, claim: dict[str, Any]) -> None:
        claim["claim_key"] = str(self.id)
        if self.resent:
            claim["resent"] = True


@dataclass(frozen=True)
class Completion:
    """One outcome to report: a success with its result, or a failure (`transient`: retried
    with backoff while attempts remain; `permanent`: a dead letter)."""

    occurrence_id: str
    epoch: int
    result: JSON = None
    failure_class: str | None = None
    message: str = ""

    @classmethod
    def success(cls, occurrence_id: str, epoch: int, result: JSON = None) -> Completion:
        return cls(occurrence_id=occurrence_id, epoch=epoch, result=result)

    @classmethod
    def failure(
        cls, occurrence_id: str, epoch: int, failure_class: str, message: str = ""
    ) -> Completion:
        if failure_class not in ("transient", "permanent"):
            raise ValueError(f"failure_class must be 'transient' or 'permanent', not {failure_class!r}")
        return cls(
            occurrence_id=occurrence_id,
            epoch=epoch,
            failure_class=failure_class,
            message=message,
        )

    def to_json(self) -> dict[str, Any]:
        item: dict[str, Any] = {"occurrence_id": self.occurrence_id, "epoch": self.epoch}
        if self.failure_class is None:
            item["result"] = self.result
        else:
            item["failure"] = {"class": self.failure_class, "message": self.message}
        return item


@dataclass(frozen=True)
class ClaimNext:
    """A claim riding on a report: up to `max_count` more occurrences of `queue` for the
    same worker, in the same round trip."""

    queue: str
    max_count: int = 1
    lease_seconds: int | None = None
    key: ClaimKey | None = None

    def to_json(self) -> dict[str, Any]:
        claim: dict[str, Any] = {"queue": self.queue, "max": self.max_count}
        if self.lease_seconds is not None:
            claim["lease_seconds"] = self.lease_seconds
        if self.key is not None:
            self.key.write(claim)
        return claim


@dataclass
class _Call(Generic[T]):
    """One request and how its answer is read: what `Client` and `AsyncClient` share."""

    method: str
    path: str
    parse: Callable[[Any], T]
    body: Any = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    on_conflict: Callable[[ApiError], T | None] | None = None
    """Reads a 409 as an answer instead of an error (a refused report, as an `Outcome`)."""

    def content(self) -> bytes | None:
        if self.body is None:
            return None
        try:
            return json.dumps(self.body, allow_nan=False, separators=(",", ":")).encode()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{self.method} {self.path}: the body is not JSON: {e}") from e

    def answer(self, status: int, content: bytes) -> T:
        if 200 <= status < 300:
            try:
                value = json.loads(content)
            except ValueError as e:
                raise DecodeError(f"{self.method} {self.path}: not JSON: {content[:200]!r}") from e
            return self.parse(value)
        err = _api_error(status, content)
        if self.on_conflict is not None and status == 409:
            read = self.on_conflict(err)
            if read is not None:
                return read
        raise err


def _api_error(status: int, content: bytes) -> ApiError:
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        return ApiError(status, body["code"], str(body.get("message", "")), body.get("details"))
    code = "unavailable" if status == 503 else "unknown"
    return ApiError(status, code, content.decode("utf-8", "replace"))


def _fenced(occurrence_id: str) -> Callable[[ApiError], Outcome | None]:
    """A refused report (409 `lease_conflict`) as a `conflict` outcome naming the check."""

    def read(err: ApiError) -> Outcome | None:
        check = err.lease_conflict
        if check is None:
            return None
        details = err.details if isinstance(err.details, dict) else {}
        state = details.get("state")
        return Outcome(
            occurrence_id=occurrence_id,
            outcome="conflict",
            state=state if isinstance(state, str) else None,
            check=check,
            message=err.message,
        )

    return read


def _query(**values: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in values.items():
        if v is None:
            continue
        out[k.rstrip("_")] = format_instant(v) if hasattr(v, "tzinfo") else str(v)
    return out


def _path_id(value: str) -> str:
    text = str(value)
    if not text or "/" in text or "?" in text or "#" in text:
        raise ConfigError(f"not an id: {value!r}")
    return text


def _claimed(value: Any) -> list[Claimed]:
    if not isinstance(value, dict) or not isinstance(value.get("occurrences"), list):
        raise DecodeError(f"claim: expected {{'occurrences': [...]}}, got {value!r}")
    return [Claimed.from_json(c) for c in value["occurrences"]]


def _renewals(value: Any) -> list[Renewal]:
    if not isinstance(value, dict) or not isinstance(value.get("leases"), list):
        raise DecodeError(f"renewal: expected {{'leases': [...]}}, got {value!r}")
    return [Renewal.from_json(r) for r in value["leases"]]


def _reported(value: Any) -> Reported:
    if not isinstance(value, dict) or not isinstance(value.get("results"), list):
        raise DecodeError(f"completions: expected {{'results': [...]}}, got {value!r}")
    return Reported(
        results=[Outcome.from_json(o) for o in value["results"]],
        claimed=[Claimed.from_json(c) for c in value.get("claimed") or []],
        claimed_truncated=bool(value.get("claimed_truncated", False)),
    )


class _Calls:
    """Every API operation as a `_Call`: the one description both clients send."""

    @staticmethod
    def create_schedule(definition: Mapping[str, Any], idempotency_key: str | None) -> _Call[Schedule]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return _Call("POST", "/v1/schedules", Schedule.from_json, dict(definition), headers=headers)

    @staticmethod
    def get_schedule(schedule_id: str) -> _Call[Schedule]:
        return _Call("GET", f"/v1/schedules/{_path_id(schedule_id)}", Schedule.from_json)

    @staticmethod
    def list_schedules(
        state: str | None, queue: str | None, limit: int | None, cursor: str | None
    ) -> _Call[SchedulePage]:
        params = _query(state=state, queue=queue, limit=limit, cursor=cursor)
        return _Call("GET", "/v1/schedules", SchedulePage.from_json, params=params)

    @staticmethod
    def update_schedule(
        schedule_id: str, version: int, definition: Mapping[str, Any]
    ) -> _Call[ScheduleChange]:
        body = dict(definition)
        body["version"] = version
        path = f"/v1/schedules/{_path_id(schedule_id)}"
        return _Call("PATCH", path, ScheduleChange.from_json, body)

    @staticmethod
    def schedule_action(schedule_id: str, action: str) -> _Call[ScheduleChange]:
        path = f"/v1/schedules/{_path_id(schedule_id)}/{action}"
        return _Call("POST", path, ScheduleChange.from_json)

    @staticmethod
    def trigger_schedule(schedule_id: str, idempotency_key: str | None) -> _Call[Occurrence]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        path = f"/v1/schedules/{_path_id(schedule_id)}/trigger"
        return _Call("POST", path, Occurrence.from_json, headers=headers)

    @staticmethod
    def backfill_schedule(
        schedule_id: str,
        start: Any,
        end: Any,
        overlap: str | None,
        idempotency_key: str | None,
    ) -> _Call[Backfill]:
        body: dict[str, Any] = {"from": format_instant(start), "to": format_instant(end)}
        if overlap is not None:
            body["overlap"] = overlap
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        path = f"/v1/schedules/{_path_id(schedule_id)}/backfill"
        return _Call("POST", path, Backfill.from_json, body, headers=headers)

    @staticmethod
    def list_occurrences(
        schedule_id: str | None,
        state: str | None,
        start: Any,
        end: Any,
        limit: int | None,
        cursor: str | None,
    ) -> _Call[OccurrencePage]:
        params = _query(
            schedule_id=schedule_id, state=state, from_=start, to=end, limit=limit, cursor=cursor
        )
        return _Call("GET", "/v1/occurrences", OccurrencePage.from_json, params=params)

    @staticmethod
    def get_occurrence(occurrence_id: str) -> _Call[Occurrence]:
        return _Call("GET", f"/v1/occurrences/{_path_id(occurrence_id)}", Occurrence.from_json)

    @staticmethod
    def occurrence_action(occurrence_id: str, action: str) -> _Call[Outcome]:
        path = f"/v1/occurrences/{_path_id(occurrence_id)}/{action}"
        return _Call("POST", path, Outcome.from_json)

    @staticmethod
    def claim(
        queue: str,
        worker_id: str,
        max_count: int,
        lease_seconds: int | None,
        claim_key: ClaimKey | None,
    ) -> _Call[list[Claimed]]:
        body: dict[str, Any] = {"worker_id": worker_id, "max": max_count}
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        if claim_key is not None:
            claim_key.write(body)
        path = f"/v1/queues/{quote(queue, safe='')}/claim"
        return _Call("POST", path, _claimed, body)

    @staticmethod
    def renew(
        worker_id: str, leases: Iterable[tuple[str, int]], lease_seconds: int | None
    ) -> _Call[list[Renewal]]:
        body: dict[str, Any] = {
            "worker_id": worker_id,
            "leases": [{"occurrence_id": i, "epoch": e} for i, e in leases],
        }
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        return _Call("POST", "/v1/leases/renew", _renewals, body)

    @staticmethod
    def complete(occurrence_id: str, worker_id: str, epoch: int, result: JSON) -> _Call[Outcome]:
        body = {"worker_id": worker_id, "epoch": epoch, "result": result}
        path = f"/v1/occurrences/{_path_id(occurrence_id)}/complete"
        return _Call("POST", path, Outcome.from_json, body, on_conflict=_fenced(occurrence_id))

    @staticmethod
    def fail(
        occurrence_id: str, worker_id: str, epoch: int, failure_class: str, message: str
    ) -> _Call[Outcome]:
        if failure_class not in ("transient", "permanent"):
            raise ValueError(f"failure_class must be 'transient' or 'permanent', not {failure_class!r}")
        body = {"worker_id": worker_id, "epoch": epoch, "class": failure_class, "message": message}
        path = f"/v1/occurrences/{_path_id(occurrence_id)}/fail"
        return _Call("POST", path, Outcome.from_json, body, on_conflict=_fenced(occurrence_id))

    @staticmethod
    def completions(
        worker_id: str, items: Sequence[Completion], claim: ClaimNext | None
    ) -> _Call[Reported]:
        body: dict[str, Any] = {"worker_id": worker_id, "items": [i.to_json() for i in items]}
        if claim is not None:
            body["claim"] = claim.to_json()
        return _Call("POST", "/v1/completions", _reported, body)


def _base(base_url: str) -> str:
    base = base_url.rstrip("/")
    if not (base.startswith("http://") or base.startswith("https://")):
        raise ConfigError(f"base URL {base_url!r} must start with http:// or https://")
    return base


def _verify(verify: bool | str | ssl.SSLContext) -> bool | ssl.SSLContext:
    """`True`: the platform's trusted roots; a path: those and the CA bundle at it."""
    if isinstance(verify, ssl.SSLContext) or verify is False:
        return verify
    context = ssl.create_default_context()
    if isinstance(verify, str):
        try:
            context.load_verify_locations(cafile=verify)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"CA bundle {verify!r}: {e}") from e
    return context


def _headers(api_key: str) -> dict[str, str]:
    if not api_key or not all(0x21 <= ord(c) <= 0x7E for c in api_key):
        raise ConfigError("the API key must be visible ASCII characters (cmp_…)")
    return {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}


class Client:
    """A blocking client of one tenant's API.

    `verify`: `True` trusts the platform's roots for an `https://` base URL; a path to a PEM
    bundle trusts its CAs too (a private CA in front of the nodes); an `ssl.SSLContext` is
    used as given.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        verify: bool | str | ssl.SSLContext = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = _base(base_url)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=_headers(api_key),
            timeout=timeout,
            verify=_verify(verify),
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: _Call[T]) -> T:
        headers = dict(call.headers or {})
        content = call.content()
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            r = self._http.request(
                call.method, call.path, content=content, params=call.params, headers=headers
            )
        except httpx.RequestError as e:
            raise TransportError(f"{call.method} {call.path}: {type(e).__name__}: {e}") from e
        return call.answer(r.status_code, r.content)

    def ready(self) -> bool:
        """Whether the node is ready for work (`GET /readyz` answers 200)."""
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.RequestError:
            return False

    # Schedules.

    def create_schedule(
        self, definition: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Schedule:
        """`POST /v1/schedules`; `idempotency_key` makes a retried create answer the same
        schedule."""
        return self._send(_Calls.create_schedule(definition, idempotency_key))

    def get_schedule(self, schedule_id: str) -> Schedule:
        return self._send(_Calls.get_schedule(schedule_id))

    def list_schedules(
        self,
        *,
        state: str | None = None,
        queue: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> SchedulePage:
        return self._send(_Calls.list_schedules(state, queue, limit, cursor))

    def update_schedule(
        self, schedule_id: str, version: int, definition: Mapping[str, Any]
    ) -> ScheduleChange:
        """Replaces the definition; `version` is the one read (409 `version_conflict` when it
        changed since)."""
        return self._send(_Calls.update_schedule(schedule_id, version, definition))

    def pause_schedule(self, schedule_id: str) -> ScheduleChange:
        return self._send(_Calls.schedule_action(schedule_id, "pause"))

    def resume_schedule(self, schedule_id: str) -> ScheduleChange:
        return self._send(_Calls.schedule_action(schedule_id, "resume"))

    def cancel_schedule(self, schedule_id: str) -> ScheduleChange:
        return self._send(_Calls.schedule_action(schedule_id, "cancel"))

    def trigger_schedule(
        self, schedule_id: str, *, idempotency_key: str | None = None
    ) -> Occurrence:
        """Runs the schedule now: one occurrence, ready at once, marked `manual`."""
        return self._send(_Calls.trigger_schedule(schedule_id, idempotency_key))

    def backfill_schedule(
        self,
        schedule_id: str,
        *,
        start: Any,
        end: Any,
        overlap: str | None = None,
        idempotency_key: str | None = None,
    ) -> Backfill:
        """Runs the instants of `[start, end)` that have no occurrence (the API's `from` and
        `to`: aware `datetime`s or RFC 3339 strings)."""
        return self._send(
            _Calls.backfill_schedule(schedule_id, start, end, overlap, idempotency_key)
        )

    # Occurrences.

    def list_occurrences(
        self,
        *,
        schedule_id: str | None = None,
        state: str | None = None,
        start: Any = None,
        end: Any = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> OccurrencePage:
        """Occurrences in planned order; `start`/`end` bound `scheduled_for` (the API's
        `from` and `to`)."""
        return self._send(_Calls.list_occurrences(schedule_id, state, start, end, limit, cursor))

    def get_occurrence(self, occurrence_id: str) -> Occurrence:
        """One occurrence, with its attempts and result."""
        return self._send(_Calls.get_occurrence(occurrence_id))

    def redrive_occurrence(self, occurrence_id: str) -> Outcome:
        """Makes a `DEAD` occurrence ready again (409 `wrong_state` otherwise)."""
        return self._send(_Calls.occurrence_action(occurrence_id, "redrive"))

    def cancel_occurrence(self, occurrence_id: str) -> Outcome:
        """Cancels a pending occurrence, or flags a running one (its worker sees it on its
        next heartbeat)."""
        return self._send(_Calls.occurrence_action(occurrence_id, "cancel"))

    # The worker protocol.

    def claim(
        self,
        queue: str,
        worker_id: str,
        *,
        max_count: int = 1,
        lease_seconds: int | None = None,
        claim_key: ClaimKey | None = None,
    ) -> list[Claimed]:
        """Claims up to `max_count` due occurrences of `queue`, leased to `worker_id`."""
        return self._send(_Calls.claim(queue, worker_id, max_count, lease_seconds, claim_key))

    def renew(
        self,
        worker_id: str,
        leases: Iterable[tuple[str, int]],
        *,
        lease_seconds: int | None = None,
    ) -> list[Renewal]:
        """Renews held leases (`(occurrence_id, epoch)`, up to 1000) in one call."""
        return self._send(_Calls.renew(worker_id, leases, lease_seconds))

    def complete(
        self, occurrence_id: str, worker_id: str, epoch: int, result: JSON = None
    ) -> Outcome:
        """Reports a success. A refusal by the fence (the lease is not this worker's any
        more) is an `Outcome` with `outcome == "conflict"` and the failed `check`."""
        return self._send(_Calls.complete(occurrence_id, worker_id, epoch, result))

    def fail(
        self,
        occurrence_id: str,
        worker_id: str,
        epoch: int,
        failure_class: str,
        message: str = "",
    ) -> Outcome:
        """Reports a failure (`transient` or `permanent`), fenced as `complete` is."""
        return self._send(_Calls.fail(occurrence_id, worker_id, epoch, failure_class, message))

    def completions(
        self,
        worker_id: str,
        items: Sequence[Completion],
        *,
        claim: ClaimNext | None = None,
    ) -> Reported:
        """Reports many outcomes, each fenced on its own, and with `claim` claims more work
        in the same request."""
        return self._send(_Calls.completions(worker_id, items, claim))


class AsyncClient:
    """The asyncio client: `Client`'s methods, awaited."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        verify: bool | str | ssl.SSLContext = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = _base(base_url)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=_headers(api_key),
            timeout=timeout,
            verify=_verify(verify),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: _Call[T]) -> T:
        headers = dict(call.headers or {})
        content = call.content()
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            r = await self._http.request(
                call.method, call.path, content=content, params=call.params, headers=headers
            )
        except httpx.RequestError as e:
            raise TransportError(f"{call.method} {call.path}: {type(e).__name__}: {e}") from e
        return call.answer(r.status_code, r.content)

    async def ready(self) -> bool:
        try:
            return (await self._http.get("/readyz")).status_code == 200
        except httpx.RequestError:
            return False

    async def create_schedule(
        self, definition: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Schedule:
        return await self._send(_Calls.create_schedule(definition, idempotency_key))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._send(_Calls.get_schedule(schedule_id))

    async def list_schedules(
        self,
        *,
        state: str | None = None,
        queue: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> SchedulePage:
        return await self._send(_Calls.list_schedules(state, queue, limit, cursor))

    async def update_schedule(
        self, schedule_id: str, version: int, definition: Mapping[str, Any]
    ) -> ScheduleChange:
        return await self._send(_Calls.update_schedule(schedule_id, version, definition))

    async def pause_schedule(self, schedule_id: str) -> ScheduleChange:
        return await self._send(_Calls.schedule_action(schedule_id, "pause"))

    async def resume_schedule(self, schedule_id: str) -> ScheduleChange:
        return await self._send(_Calls.schedule_action(schedule_id, "resume"))

    async def cancel_schedule(self, schedule_id: str) -> ScheduleChange:
        return await self._send(_Calls.schedule_action(schedule_id, "cancel"))

    async def trigger_schedule(
        self, schedule_id: str, *, idempotency_key: str | None = None
    ) -> Occurrence:
        return await self._send(_Calls.trigger_schedule(schedule_id, idempotency_key))

    async def backfill_schedule(
        self,
        schedule_id: str,
        *,
        start: Any,
        end: Any,
        overlap: str | None = None,
        idempotency_key: str | None = None,
    ) -> Backfill:
        return await self._send(
            _Calls.backfill_schedule(schedule_id, start, end, overlap, idempotency_key)
        )

    async def list_occurrences(
        self,
        *,
        schedule_id: str | None = None,
        state: str | None = None,
        start: Any = None,
        end: Any = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> OccurrencePage:
        return await self._send(
            _Calls.list_occurrences(schedule_id, state, start, end, limit, cursor)
        )

    async def get_occurrence(self, occurrence_id: str) -> Occurrence:
        return await self._send(_Calls.get_occurrence(occurrence_id))

    async def redrive_occurrence(self, occurrence_id: str) -> Outcome:
        return await self._send(_Calls.occurrence_action(occurrence_id, "redrive"))

    async def cancel_occurrence(self, occurrence_id: str) -> Outcome:
        return await self._send(_Calls.occurrence_action(occurrence_id, "cancel"))

    async def claim(
        self,
        queue: str,
        worker_id: str,
        *,
        max_count: int = 1,
        lease_seconds: int | None = None,
        claim_key: ClaimKey | None = None,
    ) -> list[Claimed]:
        return await self._send(
            _Calls.claim(queue, worker_id, max_count, lease_seconds, claim_key)
        )

    async def renew(
        self,
        worker_id: str,
        leases: Iterable[tuple[str, int]],
        *,
        lease_seconds: int | None = None,
    ) -> list[Renewal]:
        return await self._send(_Calls.renew(worker_id, leases, lease_seconds))

    async def complete(
        self, occurrence_id: str, worker_id: str, epoch: int, result: JSON = None
    ) -> Outcome:
        return await self._send(_Calls.complete(occurrence_id, worker_id, epoch, result))

    async def fail(
        self,
        occurrence_id: str,
        worker_id: str,
        epoch: int,
        failure_class: str,
        message: str = "",
    ) -> Outcome:
        return await self._send(
            _Calls.fail(occurrence_id, worker_id, epoch, failure_class, message)
        )

    async def completions(
        self,
        worker_id: str,
        items: Sequence[Completion],
        *,
        claim: ClaimNext | None = None,
    ) -> Reported:
        return await self._send(_Calls.completions(worker_id, items, claim))
