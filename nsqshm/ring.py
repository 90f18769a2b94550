"""The shared-memory ring: the building block of every queue in the broker.

A thin facade over nsqshm._core.ring; see its docstring and docs/ring.md
for the layout, the wake-up protocol and what a process death can do.
"""

from nsqshm._core.ring import (
    EMPTY,
    FULL,
    MAX_WAITERS,
    OK,
    RECORD_OVERHEAD,
    TOO_BIG,
    Ring,
    RingCorruptError,
    RingError,
    RingLayoutError,
    RingRetired,
    RingVersionError,
    set_sleeper,
    validate_name,
)

__all__ = [
    "EMPTY", "FULL", "MAX_WAITERS", "OK", "RECORD_OVERHEAD", "TOO_BIG", "Ring",
    "RingCorruptError", "RingError", "RingLayoutError", "RingRetired", "RingVersionError",
    "set_sleeper", "use_gevent", "validate_name",
]


def _gevent_sleep(fd, timeout):
    from gevent.socket import wait_read

    try:
        wait_read(fd, timeout)
    except Exception as exc:  # gevent raises its own timeout type
        if type(exc).__name__ != "timeout" and "timed out" not in str(exc):
            raise


def use_gevent():
    """Make blocking ring calls yield to the gevent hub instead of blocking."""
    set_sleeper(_gevent_sleep)
