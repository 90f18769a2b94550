"""Sleep in the gevent hub until a file descriptor is readable or an event
is set, whichever comes first: a queue's owner waits for pushes into its
ring from any process (the ring's wake FIFO) and for local news (an event)."""

import gevent
from gevent import get_hub
from gevent.hub import Waiter


def wait_fd_or_event(fd, event, timeout=None):
    if event.is_set():
        return
    hub = get_hub()
    waiter = Waiter(hub)
    watcher = hub.loop.io(fd, 1)
    watcher.start(waiter.switch, None)

    def on_event(_):
        waiter.switch(None)

    event.rawlink(on_event)
    timer = None
    if timeout is not None:
        timer = hub.loop.timer(timeout)
        timer.start(waiter.switch, None)
    try:
        waiter.get()
    finally:
        watcher.stop()
        watcher.close()
        event.unlink(on_event)
        if timer is not None:
            timer.stop()
            timer.close()


class RingWaker:
    """A ring handle's wake-ups as gevent events, for the life of the handle.

    From the first arm() on, one io watcher stays on the handle's wake FIFO:
    a byte from another process (a push or pop there) drains the FIFO and
    sets every event; a push or pop through this handle in this process sets
    the matching event directly (Ring.set_local_waker).  A queue's loop then
    waits with event.wait() after arm(): no watcher made and no epoll_ctl or
    read per wait, which at low rates was most of the system calls of a
    message.  A handle that never waits claims no waiter slot (a ring has 64).
    Spurious wake-ups are harmless: every loop checks the ring again."""

    def __init__(self, ring, data, space=None):
        self.ring = ring
        self.data = data
        self.space = space if space is not None else data
        self._watcher = None

    def arm(self, for_space=False):
        """ring.arm(for_space), watching the FIFO from the first call on."""
        if self._watcher is None:
            try:
                fd = self.ring.fileno()
            except FileNotFoundError:
                # the queue was deleted on another worker (its ring and FIFOs
                # unlinked) and the change has not reached this one yet: no
                # FIFO to watch; the caller's loop checks again after a pause
                # and the delete stops it
                gevent.sleep(0.05)
                self.data.set()
                self.space.set()
                return
            self.ring.set_local_waker(self._local)
            self._watcher = get_hub().loop.io(fd, 1)
            self._watcher.start(self._on_fifo)
        self.ring.arm(for_space)

    def _local(self, for_space):
        (self.space if for_space else self.data).set()

    def _on_fifo(self):
        self.ring.drain()
        self.data.set()
        self.space.set()

    def close(self):
        """Before the ring handle closes (its FIFO with it)."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher.close()
            self._watcher = None
        self.ring.set_local_waker(None)
