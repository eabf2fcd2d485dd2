"""What the client raises: one base class, and one subclass per kind of failure."""

from __future__ import annotations

from typing import Any


class CampanileError(Exception):
    """Any failure of the client."""


class ApiError(CampanileError):
    """The API answered with an error (`{code, message, details}`, with an HTTP status)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status}: {message} ({code})")
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    @property
    def lease_conflict(self) -> str | None:
        """For a fencing refusal (409 `lease_conflict`), the check that failed
        (`stale_epoch`, `not_owner`, `lease_expired`, `wrong_state`, `not_claimed`)."""
        if self.status == 409 and self.code == "lease_conflict" and isinstance(self.details, dict):
            check = self.details.get("check")
            return check if isinstance(check, str) else None
        return None

    @property
    def retryable(self) -> bool:
        """The node could not take the request now (503: its database unreachable, or it is
        starting): sent again later, it may be."""
        return self.status == 503


class TransportError(CampanileError):
    """The request got no answer (connection refused or broken, timeout, TLS refused): it may
    or may not have been carried out."""


class DecodeError(CampanileError):
    """The answer was not what the API documents."""


class ConfigError(CampanileError):
    """The client or worker was set up wrong (a base URL that is not http(s), a bad setting)."""
