"""Arrow record batches of messages, in the row schema of the Spark source:

    body binary, id string, timestamp timestamp (UTC, us), attempts int,
    topic string, channel string

built from the buffers nsqshm._core.localbatch.Columns fills in C, without
a Python object per message.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def record_batch(exported, topic, channel):
    """A RecordBatch from Columns.export()'s (rows, values, offsets, ids, ts, attempts, ...)."""
    n, values, offsets, ids, ts, attempts = exported[:6]
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


def headers_array(exported):
    """The headers column (Kafka's type: list<struct<key: string, value:
    binary>>, null where a message has none) of a Columns(ext=True,
    headers=True).export(); None when the Columns gathered no headers."""
    n, headers = exported[0], exported[6]
    if headers is None:
        return None
    valid, rows, pairs, key_offsets, keys, value_offsets, values = headers
    pairs_array = pa.StructArray.from_arrays(
        [pa.Array.from_buffers(pa.string(), pairs, [None, pa.py_buffer(key_offsets),
                                                    pa.py_buffer(keys)]),
         pa.Array.from_buffers(pa.binary(), pairs, [None, pa.py_buffer(value_offsets),
                                                    pa.py_buffer(values)])],
        fields=list(HEADERS_TYPE.value_type))
    return pa.Array.from_buffers(HEADERS_TYPE, n, [pa.py_buffer(valid), pa.py_buffer(rows)],
                                 children=[pairs_array])


def with_headers(exported, topic, channel, headers):
    """record_batch, and with `headers` the headers column last (all null
    when the Columns gathered none: a topic without ext)."""
    rb = record_batch(exported, topic, channel)
    if not headers:
        return rb
    column = headers_array(exported)
    return rb.append_column("headers", column if column is not None else
                            null_headers(rb.num_rows))


def header_spans(array):
    """A headers column given to the sink (list<struct<key, value>>, string or
    binary) as localbatch.mpub_ext_body takes it: (rows int32 numpy offsets
    into the pairs, valid uint8 numpy, (key data, offsets, start), (value
    data, offsets, start), pairs).  ValueError for another type or a null
    key or value."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    t = array.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or \
            not pa.types.is_struct(t.value_type) or \
            [f.name for f in t.value_type] != ["key", "value"]:
        raise TypeError(f"headers must be array<struct<key, value>>, not {t}")
    # the list's own n + 1 offsets (its slice) into all of array.values; no
    # cast of the list itself (a sliced list's cast rebases its offsets)
    pairs = array.values
    if len(pairs) > 0x7FFFFFFF:
        raise ValueError("over 2**31 headers in one batch")
    rows = np.ascontiguousarray(array.offsets.to_numpy(), dtype=np.int32)
    keys = pairs.field("key").cast(pa.binary())
    values = pairs.field("value").cast(pa.binary())
    if keys.null_count or values.null_count:
        raise ValueError("a header with a null key or value")
    if len(keys) and pc.min(pc.binary_length(keys)).as_py() == 0:
        raise ValueError("a header with an empty key")
    valid = np.asarray(array.is_valid(), dtype=np.uint8)

    def spans(a):
        data = a.buffers()[2] or pa.py_buffer(b"")
        return data, a.buffers()[1], a.offset

    return rows, valid, spans(keys), spans(values), len(keys)


def null_headers(n):
    """A headers column of n nulls (a topic without ext: no message has headers)."""
    return pa.nulls(n, HEADERS_TYPE)


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
