"""Type stubs for tracelog.pyx: a worker's trace log, written in C."""

from collections.abc import Buffer

TRACE_MAGIC: int
RECORD_SIZE: int
EVENTS: dict[int, str]
EVENT_CODES: dict[str, int]
DROP_CODES: dict[str, int]  # DROPPED's value: why

class TraceWriter:
    size: int  # read-only: bytes in the current file
    max_bytes: int  # read-only
    written: int  # read-only: events written since start
    last_errno: int  # read-only
    failed: int  # read-only: events lost to failed writes
    def __init__(self, path: bytes, max_bytes: int) -> None: ...
    def close(self) -> None: ...
    def published(self, packed: Buffer, count: int, stream: int, address: bytes | None = ...,
                  trace_ids: list[int] | None = ..., partition: int = ...,
                  first: int = ...) -> int: ...
    def records(self, packed: Buffer, count: int, event: int, stream: int,
                value: int = ...) -> int: ...
    def delivered(self, out: Buffer, base: int, stream: int,
                  address: bytes | None = ...) -> int: ...
    def event(self, event: int, msg_id: Buffer, stream: int, address: bytes | None = ...,
              value: int = ..., attempt: int = ...) -> int: ...

def find(data: Buffer, ids: Buffer | None = ..., trace_id: int = ...) -> list[int]: ...
