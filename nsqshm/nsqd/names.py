"""Topic and channel names, validated exactly as nsqd's protocol/names.go."""

import re

_VALID = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?\Z")
EPHEMERAL_SUFFIX = "#ephemeral"


def is_valid_name(name):
    """1-64 bytes of [.a-zA-Z0-9_-], optionally ending in #ephemeral."""
    if isinstance(name, (bytes, bytearray)):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            return False
    return 1 <= len(name) <= 64 and _VALID.match(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name):
    return name.endswith(EPHEMERAL_SUFFIX)


def go_quote(value):
    """Go's %q of a string or bytes (strconv.Quote): used in nsqd's error texts."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    out = ['"']
    i = 0
    text = bytes(value)
    while i < len(text):
        b = text[i]
        if b < 0x80:
            ch = chr(b)
            if ch == '"':
                out.append('\\"')
            elif ch == "\\":
                out.append("\\\\")
            elif ch == "\n":
                out.append("\\n")
            elif ch == "\t":
                out.append("\\t")
            elif ch == "\r":
                out.append("\\r")
            elif ch == "\a":
                out.append("\\a")
            elif ch == "\b":
                out.append("\\b")
            elif ch == "\f":
                out.append("\\f")
            elif ch == "\v":
                out.append("\\v")
            elif b < 0x20 or b == 0x7F:
                out.append(f"\\x{b:02x}")
            else:
                out.append(ch)
            i += 1
            continue
        # a multi-byte UTF-8 sequence: keep it if valid and printable
        for width in (2, 3, 4):
            chunk = text[i:i + width]
            try:
                ch = chunk.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if ch.isprintable():
                out.append(ch)
            elif ord(ch) <= 0xFFFF:
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(f"\\U{ord(ch):08x}")
            i += width
            break
        else:
            out.append(f"\\x{b:02x}")
            i += 1
    out.append('"')
    return "".join(out)


def inbound_ring_suffix(topic, partition):
    """A log topic partition's inbound ring, after the broker's shm prefix: the
    other workers' and the local producers' publishes (nsqd/logtopics/partition.py,
    nsqshm.local).  ':' is in no topic name, so it never meets a topic's ring."""
    return f"t.{topic}:p{int(partition)}"
