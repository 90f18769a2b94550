"""A message's own time to live (issue 18; nsqd has none): `ttl=<ms>` on
/pub and /mpub, as DPUB's `defer=<ms>`, or the `##ttl_ms` header of an ext
topic's message (PUB_EXT, MPUB_EXT, /pub_ext, /mpub_ext: a JSON string of
decimal digits, as Youzan's reserved `##` headers are strings), gives each
message published a deadline of now + ttl.  The deadline is stored with the
message (includes/message_expiry.h: 8 bytes after the body, flagged by the
top bit of the attempts field), so it survives the ring, the disk queue,
REQ, timeouts and restarts; the channel's in-flight table checks it in C as
it takes the message (InFlight.deliver, with the topic's and channel's time
to live): an expired message is never delivered, dropped or sent to the
channel's dead-letter topic (dead_letter_expired) and counted in
`expired_count`.  Clients get the message as nsqd encodes it (an ext
client, Youzan's layout: the `##ttl_ms` header stays in its headers).

The deadline takes 8 of the message's bytes: a body with a time to live
may be --max-msg-size less 8 bytes.  Log topics (their own storage) refuse
it: 400 NOT_SUPPORTED_ON_LOG_TOPIC (E_BAD_BODY over TCP).  A bad value is
400 INVALID_TTL; 0 is no time to live, as defer=0 is no delay.  With both
ttl= and a `##ttl_ms` header, ttl= wins (the request's over the message's).
PUB_EXT and MPUB_EXT read the header in C (ext.pyx pack_pub_ext).
"""

import time

from nsqshm._core.codec import with_expiry
from nsqshm._core.ext import header_ttl_ms

PARAM = "ttl"
HEADER = "##ttl_ms"
TTL_MS_MAX = 1 << 40  # about 34 years, as a topic's or channel's
EXPIRY_SIZE = 8       # bytes of a deadline after the body
EXPIRY_BIT = 0x8000   # of the attempts field: a deadline follows the body


class MessageTTLError(ValueError):
    """A ttl= the publish cannot take; its text is the HTTP error's."""


def from_query(values, is_log):
    """The deadline (ns since the epoch) of the query's ttl=, or 0 for none."""
    if PARAM not in values:
        return 0
    return deadline(values[PARAM][0], is_log)


def deadline(text, is_log):
    """The deadline of a time to live in milliseconds given as text, 0 for none."""
    if not (text.isascii() and text.isdigit()) or len(text) > 15 or int(text) > TTL_MS_MAX:
        raise MessageTTLError("INVALID_TTL")
    return _deadline_ms(int(text), is_log)


def _deadline_ms(ms, is_log):
    if ms and is_log:
        raise MessageTTLError("NOT_SUPPORTED_ON_LOG_TOPIC")
    return time.time_ns() + ms * 1_000_000 if ms else 0


def from_headers(headers, is_log):
    """The deadline of an ext message's `##ttl_ms` header (JSON headers, or
    None), 0 for none."""
    if not headers:
        return 0
    try:
        ms = header_ttl_ms(headers)
    except ValueError:
        raise MessageTTLError("INVALID_TTL") from None
    return _deadline_ms(ms or 0, is_log)


def max_body(max_msg_size, expires_at):
    """The largest body a publish may carry (its deadline takes 8 bytes)."""
    return max_msg_size - EXPIRY_SIZE if expires_at else max_msg_size


def add(packed, expires_at):
    """Packed records ([u32 native size][message]) with the deadline added
    to each (C, no Python object per message)."""
    out = bytearray()
    with_expiry(packed, len(packed), expires_at, out)
    return out
