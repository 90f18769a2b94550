"""Arrow record batches of messages, in the row schema of the Spark source:

    body binary, id string, timestamp timestamp (UTC, us), attempts int,
    topic string, channel string

built from the buffers nsqshm._core.localbatch.Columns fills in C, without
a Python object per message.
"""

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema([
    ("body", pa.binary()),
    ("id", pa.string()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("attempts", pa.int32()),
    ("topic", pa.string()),
    ("channel", pa.string()),
])


def _constant_strings(value, n):
    """A string array of n copies of `value`."""
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(raw * n)])


def record_batch(exported, topic, channel):
    """A RecordBatch from Columns.export()'s (rows, values, offsets, ids, ts, attempts)."""
    n, values, offsets, ids, ts, attempts = exported
    id_offsets = np.arange(0, 16 * (n + 1), 16, dtype=np.int32)
    columns = [
        pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                               pa.py_buffer(values)]),
        pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(id_offsets),
                                               pa.py_buffer(ids)]),
        pa.Array.from_buffers(SCHEMA.field("timestamp").type, n, [None, pa.py_buffer(ts)]),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(attempts)]),
        _constant_strings(topic, n),
        _constant_strings(channel, n),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def body_spans(array):
    """(data, offsets, width, start, count) of a binary or string Arrow array
    (chunked arrays: combined), for localbatch.pack_bodies / mpub_body."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        width = 8
    elif pa.types.is_binary(t) or pa.types.is_string(t):
        width = 4
    else:
        raise TypeError(f"message bodies must be binary or string, not {t}")
    if array.null_count:
        raise ValueError(f"{array.null_count} message bodies are null")
    _validity, offsets, data = array.buffers()
    if data is None:  # every body empty: nothing to point at
        data = pa.py_buffer(b"")
    return data, offsets, width, array.offset, len(array)
