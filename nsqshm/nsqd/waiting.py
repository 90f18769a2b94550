"""Sleep in the gevent hub until a file descriptor is readable or an event
is set, whichever comes first: a queue's owner waits for pushes into its
ring from any process (the ring's wake FIFO) and for local news (an event)."""

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
