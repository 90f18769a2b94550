"""Scratch buffers shared by a worker's queues.

A pump, a dispatcher or a refiller needs a buffer that holds a batch of
records (at least two of the largest) only while it moves one batch.  A
buffer per topic and per channel cost 2 MiB each in every worker (4 MB a
topic on two workers, and freed memory did not go back to the system).

The pool lends buffers for the length of a `with` block.  A borrower may
yield to other greenlets inside the block (a stalled pump waits there for
disk space), so a buffer is never shared: a borrower that finds none idle
gets a new one.  At most `keep` idle buffers are kept; the others are freed
when given back, so a burst of borrowers costs memory only while it lasts.
"""

from contextlib import contextmanager


class ScratchPool:
    def __init__(self, size, keep=2):
        self.size = size
        self.keep = keep
        self._idle = []
        self.lent = 0  # buffers out now (for /debug and the tests)

    @contextmanager
    def borrow(self):
        buf = self._idle.pop() if self._idle else bytearray(self.size)
        self.lent += 1
        try:
            yield buf
        finally:
            self.lent -= 1
            if len(self._idle) < self.keep:
                self._idle.append(buf)
