"""Stream compression negotiated through IDENTIFY (nsqd's UpgradeSnappy and
UpgradeDeflate): a codec encodes what the client's writer flushes, one call
per flushed chunk, and decodes what its reader receives.

- snappy: github.com/golang/snappy's framing format, in C
  (nsqshm._core.snappy);
- deflate: raw DEFLATE (RFC 1951, no zlib header) at the negotiated level,
  each flushed chunk ending on a sync flush as Go's flate.Writer.Flush does,
  so the client can decode everything sent so far.  zlib-ng when installed
  (the same format, about 1.7x faster at level 6), else zlib.

A decode error means the stream is corrupt: the connection ends, as nsqd's
read loop ends on a read error, without an error frame.
"""

try:
    from zlib_ng import zlib_ng as zlib
except ImportError:  # pragma: no cover - zlib-ng is a dependency; plain zlib works too
    import zlib

from nsqshm._core.snappy import FrameDecoder, FrameEncoder, SnappyError


class CorruptStream(Exception):
    pass


class SnappyCodec:
    name = "snappy"

    def __init__(self):
        self._encoder = FrameEncoder()
        self._decoder = FrameDecoder()

    def encode(self, data):
        return self._encoder.encode(data)

    def decode(self, data):
        try:
            return self._decoder.decode(data)
        except SnappyError as err:
            raise CorruptStream(str(err)) from None


class DeflateCodec:
    name = "deflate"

    def __init__(self, level):
        self.level = level
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._decompressor = zlib.decompressobj(-zlib.MAX_WBITS)

    def encode(self, data):
        c = self._compressor
        return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data):
        try:
            return self._decompressor.decompress(data)
        except zlib.error as err:
            raise CorruptStream(f"flate: {err}") from None


def decoding_recv(recv, codec):
    """A recv(n) that returns decoded bytes: it reads until the codec yields
    something, and returns b"" at end of stream."""
    decode = codec.decode

    def recv_decoded(n):
        while True:
            raw = recv(n)
            if not raw:
                return raw
            data = decode(raw)
            if data:
                return data

    return recv_decoded
