from collections.abc import Buffer

from nsqshm._core.codec import IdGenerator
from nsqshm._core.inflight import InFlight
from nsqshm._core.logcursor import CursorSet

MPUB_OK: int
MPUB_COUNT_UNREADABLE: int
MPUB_BAD_COUNT: int
MPUB_SIZE_UNREADABLE: int
MPUB_BAD_SIZE: int
MPUB_TOO_BIG: int
MPUB_BODY_UNREADABLE: int
MPUB_INCOMPLETE: tuple[int, int, int]

def pack_message(body: Buffer, ids: IdGenerator, timestamp: int, out: bytearray) -> bytes: ...
def pack_mpub(body: Buffer, ids: IdGenerator, timestamp: int, max_msg_size: int,
              max_body_size: int, out: bytearray) -> tuple[int, int, int]: ...
def scan_mpub(data: Buffer, start: int, pos: int, index: int, max_msg_size: int,
              max_body_size: int) -> tuple[int, int, int, int]: ...
def pack_lines(body: Buffer, ids: IdGenerator, timestamp: int, max_msg_size: int,
               out: bytearray) -> tuple[int, int]: ...
def fin_lines(buf: bytearray, pos: int, inflight: InFlight, client_id: int,
              cursors: CursorSet | None = ...) -> tuple[int, int]: ...
def scan_deliveries(data: Buffer, fins: bytearray) -> tuple[int, int, int]: ...
def mix_commands(fins: Buffer, out: bytearray, touch_every: int, req_every: int,
                 counter: int) -> tuple[int, int, int, int]: ...
def send_lines(fd: int, data: Buffer, gap_ns: int = ...) -> int: ...
