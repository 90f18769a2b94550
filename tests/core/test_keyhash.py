"""keyhash.key_partitions: a key's partition is CRC-32C of its bytes modulo
the partition count, the same for binary, string and large Arrow arrays
and for slices of them."""

import numpy as np
import pyarrow as pa
import pytest

from nsqshm._core.commitlog import crc32c
from nsqshm._core.keyhash import key_partitions
from nsqshm.local.arrow import body_spans


def partitions(array, n):
    data, offsets, width, start, count = body_spans(array)
    out = np.empty(count, dtype=np.int32)
    key_partitions(data, offsets, width, start, count, n, out)
    return out.tolist()


@pytest.mark.parametrize("kind", [pa.binary(), pa.string(), pa.large_binary()])
def test_crc32c_modulo_partitions(kind):
    keys = [b"", b"a", b"user-17", b"\xff" * 300, b"k" * 33]
    array = pa.array(keys if kind != pa.string() else [k.decode("latin-1") for k in keys], kind)
    raw = [k if kind != pa.string() else k.decode("latin-1").encode() for k in keys]
    assert partitions(array, 7) == [crc32c(k) % 7 for k in raw]
    assert partitions(array.slice(2, 2), 7) == [crc32c(k) % 7 for k in raw[2:4]]
    assert partitions(array, 1) == [0] * len(keys)
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value: stable everywhere


def test_bad_spans_refused():
    data = pa.py_buffer(b"abc")
    offsets = pa.py_buffer(np.array([0, 9], dtype=np.int32).tobytes())
    out = np.empty(1, dtype=np.int32)
    with pytest.raises(ValueError, match="outside the data"):
        key_partitions(data, offsets, 4, 0, 1, 3, out)
    with pytest.raises(ValueError, match="too short"):
        key_partitions(data, offsets, 4, 0, 2, 3, out)
    with pytest.raises(ValueError, match="bad key spans"):
        key_partitions(data, offsets, 4, 0, 1, 0, out)
