"""Type stubs for keyhash.pyx: a key's partition for the Spark sink on log topics."""

from collections.abc import Buffer

def key_partitions(data: Buffer, offsets: Buffer, width: int, start: int, count: int,
                   partitions: int, out: Buffer) -> None: ...
