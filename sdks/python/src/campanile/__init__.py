"""Python client and workers for Campanile, the multi-tenant job scheduler.

`Client` / `AsyncClient` are typed clients of one tenant's HTTP API; `Worker` (threads) and
`AsyncWorker` (asyncio) run a handler over one queue with the protocol the Rust SDK speaks:
batched claims under claim keys, a report that claims its successor, batched heartbeats, a
lost lease that stops its handler, and a graceful stop on SIGTERM.
"""

from ._protocol import (
    Job,
    JobError,
    LeaseLost,
    PermanentError,
    TransientError,
    WorkerConfig,
    WorkerReport,
)
from .client import AsyncClient, ClaimKey, ClaimNext, Client, Completion
from .errors import ApiError, CampanileError, ConfigError, DecodeError, TransportError
from .models import (
    Attempt,
    Backfill,
    Claimed,
    InFlight,
    Occurrence,
    OccurrencePage,
    Outcome,
    Renewal,
    Reported,
    Schedule,
    ScheduleChange,
    SchedulePage,
)
from .worker import AsyncWorker, Worker

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncWorker",
    "Attempt",
    "Backfill",
    "CampanileError",
    "ClaimKey",
    "ClaimNext",
    "Claimed",
    "Client",
    "Completion",
    "ConfigError",
    "DecodeError",
    "InFlight",
    "Job",
    "JobError",
    "LeaseLost",
    "Occurrence",
    "OccurrencePage",
    "Outcome",
    "PermanentError",
    "Renewal",
    "Reported",
    "Schedule",
    "ScheduleChange",
    "SchedulePage",
    "TransientError",
    "TransportError",
    "Worker",
    "WorkerConfig",
    "WorkerReport",
]
