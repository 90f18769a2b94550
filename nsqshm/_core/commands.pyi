from nsqshm._core.inflight import DeferredQueue, InFlight
from nsqshm._core.logcursor import CursorSet
from nsqshm._core.tracelog import TraceWriter

NEED_MORE: int
HANDOFF: int

class CommandParser:
    client_id: int  # read-only
    pos: int  # read-only: where reading resumes after parse()
    finished: int  # read-only: counts of the last parse()
    requeued: int
    touched: int
    nops: int
    scan_by: int  # read-only: earliest deadline or due time set (monotonic ns), -1 for none
    requeued_records: bytearray  # read-only
    def __init__(self, inflight: InFlight, deferred: DeferredQueue | None,
                 cursors: CursorSet | None, client_id: int, msg_timeout_ns: int,
                 max_msg_timeout_ns: int, max_req_timeout_ns: int) -> None: ...
    def trace_to(self, writer: TraceWriter | None, stream: int = ...,
                 address: bytes | None = ...) -> None: ...
    def take_requeued(self) -> bytearray: ...
    def parse(self, buf: bytearray, pos: int, requeue: bool = ...) -> int: ...
