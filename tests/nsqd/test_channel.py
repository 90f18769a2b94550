"""--max-channel-consumers holds for the whole broker (channel.py: the count
is in the channel ring's header, shared by the workers; recovery.py recounts
it when a worker is replaced); ephemeral channels go with their last client."""

import os
import signal
import socket
import time

import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for
from tests.nsqd.workers.test_workers import Client, client_on_worker, worker_of_pid

LIMIT_TEXT = b"E_SUB_FAILED SUB failed consumers for limited:c exceeds limit of 2"


def sub_on(server, index):
    """A connection on worker `index` (found by a PUB first), then SUB."""
    c = client_on_worker(server, index, "limited")
    c.send(p.sub("limited", "c"))
    return c, c.response()


def test_max_channel_consumers_counts_the_consumers_of_every_worker(nsqd_factory):
    server = nsqd_factory("--workers=2", "--max-channel-consumers=2")
    assert server.post("/topic/create?topic=limited")[0] == 200
    assert server.post("/channel/create?topic=limited&channel=c")[0] == 200
    c0, answer = sub_on(server, 0)
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    c1, answer = sub_on(server, 1)
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    for index in (0, 1):  # each worker has one consumer; the broker has two
        c, answer = sub_on(server, index)
        assert answer == (p.FRAME_TYPE_ERROR, LIMIT_TEXT)
        c.close()

    # one leaves (on worker 0): a consumer on worker 1 may come
    c0.close()
    c2 = None

    def room_on_1():
        nonlocal c2
        c, answer = sub_on(server, 1)
        if answer == (p.FRAME_TYPE_RESPONSE, b"OK"):
            c2 = c
            return True
        c.close()
        return False

    assert wait_for(room_on_1, timeout=10, interval=0.2)
    c, answer = sub_on(server, 0)
    assert answer == (p.FRAME_TYPE_ERROR, LIMIT_TEXT)
    c.close()

    # worker 1 (both consumers) is killed: its replacement recounts, and two
    # consumers may come again
    old = worker_of_pid(server, 1)
    os.kill(old, signal.SIGKILL)
    c1.close()
    c2.close()

    def replaced():
        try:
            return worker_of_pid(server, 1) != old
        except (AssertionError, OSError):
            return False

    assert wait_for(replaced, timeout=20, interval=0.5)
    fresh = []

    def two_fit():
        c, answer = sub_on(server, 1)
        if answer != (p.FRAME_TYPE_RESPONSE, b"OK"):
            c.close()
            return False
        fresh.append(c)
        return True

    assert wait_for(two_fit, timeout=20, interval=0.5)
    c, answer = sub_on(server, 0)
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    fresh.append(c)
    c, answer = sub_on(server, 0)
    assert answer == (p.FRAME_TYPE_ERROR, LIMIT_TEXT)
    for c in fresh:
        c.close()



def test_the_last_ephemeral_channels_of_an_ephemeral_topic_leaving_at_once(nsqd_factory):
    """Two ephemeral channels of an ephemeral topic lose their last clients
    at the same moment: each deletion deletes the topic once it has no
    channel left, and the second found it gone (a KeyError traceback, seen
    in the soak fuzz).  The topic goes once, without an error, every time."""
    server = nsqd_factory("--workers=2")
    for r in range(40):
        topic = f"gone{r}#ephemeral"
        conns = []
        for ch in ("a#ephemeral", "b#ephemeral", "c#ephemeral"):
            s = socket.create_connection(server.tcp, timeout=5)
            s.sendall(p.MAGIC_V2 + p.sub(topic, ch))
            conns.append(s)
        for s in conns:
            dec = p.FrameDecoder()
            while True:
                dec.feed(s.recv(4096))
                frames = list(dec.frames())
                if frames:
                    assert frames[0] == (p.FRAME_TYPE_RESPONSE, b"OK")
                    break
        for s in conns:
            s.close()
    time.sleep(1.0)
    log = "".join(server.lines)
    assert "Traceback" not in log, log[log.index("Traceback") - 300:][:3000]
    assert wait_for(lambda: not [e for e in os.listdir("/dev/shm")
                                 if e.startswith(f"{server.prefix}.") and ".gone" in e])


def _consumer(server, topic, rdy):
    c = Client(server)
    c.send(p.sub(topic, "c"))
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.send(p.rdy(rdy))
    return c


def _message_within(client, wait):
    client.sock.settimeout(wait)
    try:
        return client.message()
    except TimeoutError:
        return None
    finally:
        client.sock.settimeout(5)


@pytest.mark.workers(1)
def test_a_req_goes_to_the_ready_consumer_not_back_to_its_sender(nsqd_factory):
    """A consumer at its RDY takes its next messages in its own reader after
    its FINs (Channel.refill_finisher), but not after a REQ: the message put
    back goes to whichever consumer is ready, as nsqd's channel gives it to
    the pump that waits (found in review: it came straight back to the
    sender, with another consumer idle)."""
    server = nsqd_factory()
    assert server.post("/topic/create?topic=rq")[0] == 200
    assert server.post("/channel/create?topic=rq&channel=c")[0] == 200
    idle = _consumer(server, "rq", 0)  # (first in the dispatcher's order)
    sender = _consumer(server, "rq", 1)
    pc = Client(server)
    pc.send(p.pub("rq", b"m"))
    assert pc.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    m = sender.message()
    idle.send(p.rdy(1))
    time.sleep(0.2)
    sender.send(p.req(m.id, 0))
    again = _message_within(idle, 2.0)
    assert again is not None and again.body == b"m"
    assert _message_within(sender, 0.2) is None
