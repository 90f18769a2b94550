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

class ScratchPool:
    def __init__(self, size, keep=2):
        self.size = size
        self.keep = keep
        self._idle = []
        self.lent = 0  # buffers out now (for /debug and the tests)

    def borrow(self):
        """`with pool.borrow() as buf:` a buffer of `size` bytes, for the block."""
        return _Loan(self)


class _Loan:
    """One borrow's context manager (a class, not @contextmanager: a
    dispatcher borrows once a round, and a generator's context manager costs
    about four times as much)."""

    __slots__ = ("pool", "buf")

    def __init__(self, pool):
        self.pool = pool
        self.buf = None

    def __enter__(self):
        pool = self.pool
        self.buf = pool._idle.pop() if pool._idle else bytearray(pool.size)
        pool.lent += 1
        return self.buf

    def __exit__(self, *exc):
        pool = self.pool
        pool.lent -= 1
        if len(pool._idle) < pool.keep:
            pool._idle.append(self.buf)
        self.buf = None
        return False
