"""A worker in a process of its own, for the tests that kill or signal one.

    python child_worker.py URL KEY QUEUE WORKER_ID MODE

MODE `hang`: claims with 2 s leases renewed every 0.5 s, prints `CLAIMED <id> <epoch>` from
the handler and never returns (the test SIGKILLs it). MODE `slow` / `slow-async`: the sync /
asyncio worker, two handlers at once, each prints `STARTED <id>` and returns after 1.5 s; on
SIGTERM it stops as a worker does and prints `REPORT <json>` as its last line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from dataclasses import asdict

from campanile import AsyncClient, AsyncWorker, Client, Job, Worker, WorkerConfig, WorkerReport


_out = threading.Lock()


def say(line: str) -> None:
    """One whole line (handlers on two threads print at once)."""
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> None:
    url, key, queue, worker_id, mode = sys.argv[1:6]
    if mode == "hang":
        cfg = WorkerConfig(queue=queue, worker_id=worker_id, concurrency=1, batch=1,
                           lease_seconds=2, heartbeat=0.5, idle_poll=0.05)

        def hang(job: Job) -> None:
            say(f"CLAIMED {job.id} {job.epoch}")
            time.sleep(3600)

        Worker(Client(url, key), cfg).run(hang)
        return
    cfg = WorkerConfig(queue=queue, worker_id=worker_id, concurrency=2, batch=2,
                       lease_seconds=10, heartbeat=1.0, idle_poll=0.05)
    if mode == "slow":

        def slow(job: Job) -> dict[str, str]:
            say(f"STARTED {job.id}")
            time.sleep(1.5)
            return {"done": job.id}

        report = Worker(Client(url, key), cfg).run(slow)
    else:

        async def slow_async(job: Job) -> dict[str, str]:
            say(f"STARTED {job.id}")
            await asyncio.sleep(1.5)
            return {"done": job.id}

        async def run() -> WorkerReport:
            async with AsyncClient(url, key) as client:
                return await AsyncWorker(client, cfg).run(slow_async)

        report = asyncio.run(run())
    say("REPORT " + json.dumps(asdict(report)))


if __name__ == "__main__":
    main()
