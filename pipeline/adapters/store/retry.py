"""The writers' retry policy: backoff for an outage, isolation of the rows the store
rejects for their data (retrying cannot cure those)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from .faults import INJECTED_CONSTRAINT
from .protocol import StoreError

log = logging.getLogger(__name__)


def with_retry(
    fn: Callable[[], None],
    what: str,
    *,
    attempts: int | None = None,
    base_delay_s: float = 0.2,
    max_delay_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    on_failure: Callable[[Exception], None] | None = None,
    fatal: Callable[[Exception], bool] | None = None,
) -> int:
    """Run ``fn``, retrying with exponential backoff (forever when ``attempts`` is None).

    Returns the number of retries. Every write tailguard retries is idempotent
    (rows keyed by request, windows deduplicated by token). ``on_failure`` hears
    of every failed attempt before its backoff (the worker pauses its input). An
    exception ``fatal`` says retrying cannot cure (a rejected value) is raised at once.
    ``sleep`` may raise to give up (the worker's stops on SIGTERM).
    """
    retries = 0
    delay = base_delay_s
    while True:
        try:
            fn()
        except Exception as exc:
            if fatal is not None and fatal(exc):
                raise
            retries += 1
            if on_failure is not None:
                on_failure(exc)
            if attempts is not None and retries >= attempts:
                raise StoreError(f"{what} failed {retries} times: {exc}") from exc
            log.warning("ClickHouse %s failed (%s); retry %d in %.1fs", what, exc, retries, delay)
            sleep(delay)
            delay = min(delay * 2, max_delay_s)
        else:
            return retries


# --- rows the store rejects ---------------------------------------------------

# ClickHouse error codes that name the data, not the server: the same rows fail again
# whatever the retries (CANNOT_PARSE_TEXT, CANNOT_CONVERT_TYPE, TYPE_MISMATCH,
# ARGUMENT_OUT_OF_BOUND, VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE, DECIMAL_OVERFLOW,
# CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN, TOO_LARGE_STRING_SIZE, VIOLATED_CONSTRAINT, ...).
# The one constraint that is no data error is the fault injection's own
# (:data:`~pipeline.adapters.store.faults.INJECTED_CONSTRAINT`): it stands for an outage.
_DATA_ERROR_CODES = frozenset({6, 27, 32, 38, 41, 53, 69, 70, 72, 131, 321, 349, 407, 469})
_CODE_RE = re.compile(r"Code: (\d+)\.")


def is_data_error(exc: BaseException) -> bool:
    """True when ``exc`` rejects the rows themselves (retrying cannot help): the driver
    could not encode a value into its column type, or ClickHouse refused a value."""
    try:
        from clickhouse_connect.driver.exceptions import DataError
    except ImportError:  # pragma: no cover - the worker always has the driver
        DataError = ()  # type: ignore[assignment,misc]  # noqa: N806
    if isinstance(exc, DataError | OverflowError):
        return True
    text = str(exc)
    if INJECTED_CONSTRAINT in text:
        return False
    m = _CODE_RE.search(text)
    return m is not None and int(m.group(1)) in _DATA_ERROR_CODES


T = TypeVar("T")


def write_isolating(
    write: Callable[[Sequence[T]], None],
    rows: Sequence[T],
    what: str,
    *,
    retry: Callable[[Callable[[], None], str], int],
) -> tuple[int, list[tuple[T, str]]]:
    """Write ``rows``; a batch the store rejects for its data is split in halves until the
    offending rows are isolated, and the rest is written.

    ``retry(fn, what)`` runs one write with the caller's retry policy (e.g.
    :func:`with_retry` with backoff, forever, for an outage); it must let a data error
    through (``with_retry(..., fatal=is_data_error)``). Returns the retries and the
    rejected rows with the store's reason. Every write here is idempotent, so a half
    written twice is harmless.
    """
    rejected: list[tuple[T, str]] = []
    retries = 0
    stack = [list(rows)]
    while stack:
        part = stack.pop()
        try:
            retries += retry(lambda part=part: write(part), f"{what} ({len(part)} rows)")  # type: ignore[misc]
        except Exception as exc:
            if not is_data_error(exc):
                raise
            if len(part) == 1:
                reason = f"store_rejected: {what}: {exc}"
                log.warning("ClickHouse rejected one row of %s: %s", what, exc)
                rejected.append((part[0], reason))
                continue
            mid = len(part) // 2
            stack.append(part[mid:])
            stack.append(part[:mid])
    return retries, rejected
