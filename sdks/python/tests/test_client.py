"""The typed clients against a real node: schedules, occurrences and the worker calls."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from campanile import (
    ApiError,
    AsyncClient,
    ClaimKey,
    ClaimNext,
    Client,
    Completion,
    ConfigError,
    TransportError,
)
from conftest import Node, free_port

# Once a year: nothing of it is planned while a test runs; it runs when triggered.
YEARLY = "0 0 1 1 *"


def test_schedules_through_the_client(client: Client, queue_name: str) -> None:
    definition = {"queue": queue_name, "cron": "0 * * * *", "timezone": "Europe/Paris",
                  "payload": {"to": "ops@example.com", "big": 12345678901234567890123}}
    key = f"create-{uuid.uuid4()}"
    s = client.create_schedule(definition, idempotency_key=key)
    assert (s.state, s.queue, s.cron, s.timezone, s.version) == ("ACTIVE", queue_name, "0 * * * *", "Europe/Paris", 1)
    assert s.payload == definition["payload"], "integers of any size are kept"
    assert s.next_fires and all(t.tzinfo is not None for t in s.next_fires)
    assert client.create_schedule(definition, idempotency_key=key).id == s.id, "sent again: the same"
    assert client.get_schedule(s.id) == s

    page = client.list_schedules(queue=queue_name)
    assert [x.id for x in page.schedules] == [s.id] and page.next_cursor is None

    changed = client.update_schedule(s.id, s.version, {**definition, "priority": 5})
    assert (changed.schedule.version, changed.schedule.priority) == (2, 5)
    with pytest.raises(ApiError) as stale:
        client.update_schedule(s.id, 1, definition)
    assert (stale.value.status, stale.value.code) == (409, "version_conflict")

    assert client.pause_schedule(s.id).schedule.state == "PAUSED"
    with pytest.raises(ApiError) as paused:
        client.trigger_schedule(s.id)
    assert paused.value.status == 409
    assert client.resume_schedule(s.id).schedule.state == "ACTIVE"

    run = client.trigger_schedule(s.id, idempotency_key=f"run-{s.id}")
    assert (run.origin, run.state, run.schedule_id, run.attempt_count) == ("manual", "READY", s.id, 0)
    assert client.trigger_schedule(s.id, idempotency_key=f"run-{s.id}").id == run.id
    assert client.get_occurrence(run.id).attempts == []
    canceled = client.cancel_occurrence(run.id)
    assert canceled.accepted and canceled.state == "CANCELED"

    # Two hourly instants of a past range, backfilled.
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    done = client.backfill_schedule(s.id, start=hour - timedelta(hours=3), end=hour - timedelta(hours=1))
    assert done.instants == 2 and len(done.created) + len(done.rerun) == 2, done
    assert all(o.origin == "backfill" for o in done.created)
    listed = client.list_occurrences(schedule_id=s.id, start=hour - timedelta(hours=3), end=hour - timedelta(hours=1))
    assert sorted(o.id for o in listed.occurrences) == sorted(o.id for o in done.created + done.rerun)

    assert client.cancel_schedule(s.id).schedule.state == "CANCELED"


def test_the_worker_calls_and_a_refused_report(client: Client, queue_name: str) -> None:
    ids = []
    for i in range(3):
        s = client.create_schedule({"queue": queue_name, "cron": YEARLY, "payload": {"i": i}})
        ids.append(client.trigger_schedule(s.id).id)
    key = ClaimKey.new()
    got = client.claim(queue_name, "w1", max_count=2, lease_seconds=30, claim_key=key)
    assert len(got) == 2 and {c.id for c in got} <= set(ids)
    assert all(c.epoch == 1 and c.attempt == 1 and c.lease_until > datetime.now(timezone.utc) - timedelta(minutes=5) for c in got)
    # Sent again with the same key: what the first sending claimed, nothing new.
    again = client.claim(queue_name, "w1", max_count=2, lease_seconds=30, claim_key=key.again())
    assert sorted(c.id for c in again) == sorted(c.id for c in got)

    renewed = client.renew("w1", [(c.id, c.epoch) for c in got], lease_seconds=30)
    assert [r.renewed for r in renewed] == [True, True]
    assert not client.renew("w2", [(got[0].id, got[0].epoch)])[0].renewed, "not its lease"

    first, second = got
    assert client.complete(first.id, "w1", first.epoch, {"ok": True}).accepted
    # Refused by the fence: a typed outcome, not an exception.
    late = client.complete(first.id, "w1", first.epoch + 1, {"late": True})
    assert (late.outcome, late.check) == ("conflict", "stale_epoch")
    other = client.fail(second.id, "w2", second.epoch, "transient", "not mine")
    assert (other.outcome, other.check) == ("conflict", "not_owner")

    # A permanent failure, and in the same request a claim of the third occurrence.
    reported = client.completions(
        "w1",
        [Completion.failure(second.id, second.epoch, "permanent", "no recipient")],
        claim=ClaimNext(queue_name, 1, 30, ClaimKey.new()),
    )
    assert reported.results[0].accepted and reported.results[0].state == "DEAD"
    assert [c.id for c in reported.claimed] == [i for i in ids if i not in (first.id, second.id)]
    third = reported.claimed[0]
    assert client.complete(third.id, "w1", third.epoch).accepted

    dead = client.get_occurrence(second.id)
    assert dead.state == "DEAD" and dead.attempts is not None
    assert (dead.attempts[0].outcome, dead.attempts[0].error_class) == ("failed", "permanent")
    redriven = client.redrive_occurrence(second.id)
    assert redriven.accepted and redriven.state == "READY"
    with pytest.raises(ApiError) as not_dead:
        client.redrive_occurrence(first.id)
    assert (not_dead.value.status, not_dead.value.code) == (409, "wrong_state")
    assert client.get_occurrence(first.id).result == {"ok": True}


def test_the_async_client(node: Node, queue_name: str) -> None:
    async def go() -> None:
        async with AsyncClient(node.url, node.key) as c:
            assert await c.ready()
            s = await c.create_schedule({"queue": queue_name, "cron": YEARLY, "payload": [1, 2]})
            assert (await c.get_schedule(s.id)).id == s.id
            assert [x.id for x in (await c.list_schedules(queue=queue_name)).schedules] == [s.id]
            run = await c.trigger_schedule(s.id)
            [claimed] = await c.claim(queue_name, "aw", lease_seconds=30, claim_key=ClaimKey.new())
            assert (claimed.id, claimed.payload) == (run.id, [1, 2])
            assert (await c.renew("aw", [(claimed.id, claimed.epoch)]))[0].renewed
            done = await c.completions("aw", [Completion.success(claimed.id, claimed.epoch, "fine")])
            assert done.results[0].accepted and done.claimed == []
            late = await c.fail(claimed.id, "aw", claimed.epoch, "permanent", "late")
            assert (late.outcome, late.check, late.state) == ("conflict", "wrong_state", "SUCCEEDED")
            occ = (await c.list_occurrences(schedule_id=s.id, state="SUCCEEDED")).occurrences
            assert [o.result for o in occ] == ["fine"]
            assert (await c.pause_schedule(s.id)).schedule.state == "PAUSED"

    asyncio.run(go())


def test_errors_are_typed(client: Client, node: Node) -> None:
    with pytest.raises(ApiError) as missing:
        client.get_schedule(str(uuid.uuid4()))
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    with pytest.raises(ApiError) as invalid:
        client.create_schedule({"queue": "q", "cron": "not a cron"})
    assert (invalid.value.status, invalid.value.code) == (422, "validation_failed")
    with pytest.raises(ApiError) as unauthorized:
        Client(node.url, "cmp_not_a_key").list_schedules()
    assert unauthorized.value.status == 401
    with pytest.raises(TransportError):
        Client(f"http://127.0.0.1:{free_port()}", node.key, timeout=2).list_schedules()
    with pytest.raises(ConfigError):
        Client("127.0.0.1:7070", node.key)
