"""The database going away: which errors are worth retrying, a bounded retry, and the one-line error after it.

A stopped server, a restart ("the database system is starting up"), a killed embedded postmaster, a dropped
connection: retried with backoff (tenacity) for `database_retry_seconds` (kb.yaml, default 30), then
`DatabaseUnreachable`, whose str() is the one line the CLI prints (exit code 4). A wrong password or an
unknown database is a configuration mistake, not an outage: it is not retried.
"""
from __future__ import annotations

import logging
import os
import re
import time
from typing import Callable, TypeVar

import psycopg

log = logging.getLogger(__name__)

DEFAULT_RETRY_SECONDS = 30.0
T = TypeVar("T")

# SQLSTATEs of a server that is going down, coming up, or gone (class 08: connection exceptions).
_TRANSIENT_STATES = {"57P01", "57P02", "57P03", "53300"}   # admin/crash shutdown, starting up, too many clients
# libpq messages of a configuration mistake: retrying cannot fix them.
_CONFIG_MESSAGES = ("password authentication failed", "does not exist", "no pg_hba.conf entry",
                    "authentication failed", "invalid connection option", "invalid sslmode", "invalid uri",
                    "missing \"=\"")


class DatabaseUnreachable(Exception):
    """The database did not answer within the retry budget: str() is one line for the operator."""

    def __init__(self, url: str, detail: str, waited: float, origin: str = ""):
        self.url, self.detail, self.waited = redact_url(url), detail, waited
        where = f" ({origin})" if origin else ""
        super().__init__(f"the database at {self.url}{where} is unreachable: {detail} (retried for {waited:.0f} s)"
                         " — start it (or check the network), then re-run: committed work is kept")


def redact_url(url: str) -> str:
    """The URL without its password (URL or key=value form)."""
    url = re.sub(r"(://[^:/@?#]*):[^@/?#]*@", r"\1@", url or "")
    return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", url)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # libpq: 'connection to server on socket "…" failed: No such file or directory' — keep the cause
    return lines[0][:300]


def is_config_error(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, psycopg.ProgrammingError) or any(m in msg for m in _CONFIG_MESSAGES)


def is_transient(exc: BaseException) -> bool:
    """True for errors a server restart or a network blip causes, which a later attempt may not see."""
    if isinstance(exc, DatabaseUnreachable):
        return False
    if isinstance(exc, psycopg.OperationalError):
        if getattr(exc, "sqlstate", None) in _TRANSIENT_STATES:
            return True
        state = getattr(exc, "sqlstate", None) or ""
        if state.startswith("08"):
            return True
        if state:              # an operational error with another SQLSTATE (e.g. a query canceled) is not an outage
            return False
        return not is_config_error(exc)   # libpq-level (no SQLSTATE): refused, no socket, closed, timeout
    if isinstance(exc, psycopg.InterfaceError):
        return "closed" in str(exc).lower()     # used a connection the server dropped
    return False


def retry_call(fn: Callable[[], T], *, url: str, budget: float = DEFAULT_RETRY_SECONDS, origin: str = "",
               on_retry: Callable[[BaseException, float], None] | None = None,
               transient: Callable[[BaseException], bool] = is_transient, what: str = "") -> T:
    """Call fn until it returns, retrying transient database errors with backoff; after `budget` seconds of
    failures (counted from the first failure, not from the start: a long stage may fail late) raise
    DatabaseUnreachable. Other errors propagate at once."""
    from tenacity import RetryError, Retrying, retry_if_exception, wait_exponential

    first_failure: list[float] = []

    def out_of_time(state) -> bool:
        if not first_failure:
            first_failure.append(time.monotonic())
        return time.monotonic() - first_failure[0] >= budget

    def before_sleep(state) -> None:
        exc = state.outcome.exception()
        waited = time.monotonic() - first_failure[0]
        # one line per outage, not one per attempt
        log.log(logging.WARNING if state.attempt_number == 1 else logging.DEBUG,
                "%sdatabase error (%s); retrying for up to %.0f s", f"{what}: " if what else "", first_line(exc),
                max(0.0, budget - waited))
        # where it came from, for whoever turns on debug logging (KB_DEBUG_RETRIES=1 prints it)
        log.log(logging.WARNING if os.environ.get("KB_DEBUG_RETRIES") else logging.DEBUG,
                "the error that is retried", exc_info=exc)
        if on_retry is not None:
            on_retry(exc, waited)

    retrying = Retrying(retry=retry_if_exception(transient), stop=out_of_time,
                        wait=wait_exponential(multiplier=0.25, min=0.25, max=4.0), before_sleep=before_sleep,
                        reraise=False)
    try:
        return retrying(fn)
    except RetryError as err:
        exc = err.last_attempt.exception()
        waited = time.monotonic() - first_failure[0] if first_failure else 0.0
        raise DatabaseUnreachable(url, first_line(exc), waited, origin) from None
