"""Two workers creating one shared-memory object at the same moment (issue
21.2): six connections SUB to a new channel at once, 900 times; every one
is answered OK and no worker attaches to a half-made ring."""

import socket
import threading

import pytest

from nsqshm import protocol as p

pytestmark = pytest.mark.timeout(120)

CONNECTIONS = 6
ROUNDS = 150  # 900 connection attempts


def answer(sock):
    dec = p.FrameDecoder()
    while True:
        data = sock.recv(4096)
        if not data:
            return "closed"
        dec.feed(data)
        for kind, body in dec.frames():
            if body != b"_heartbeat_":
                return (kind, body)


def test_concurrent_subs_to_a_new_channel_on_two_workers_all_get_ok(nsqd_factory):
    server = nsqd_factory("--workers=2")
    barrier = threading.Barrier(CONNECTIONS)
    results = [[] for _ in range(CONNECTIONS)]

    def run(k):
        for r in range(ROUNDS):
            channel = "c#ephemeral" if r % 2 else "c"
            try:
                sock = socket.create_connection(server.tcp, timeout=5)
            except OSError as err:
                barrier.wait()
                results[k].append(f"connect: {err}")
                continue
            with sock:
                sock.sendall(p.MAGIC_V2)
                barrier.wait()  # all six send their SUB together
                try:
                    sock.sendall(p.sub(f"race{r}", channel))
                    results[k].append(answer(sock))
                except OSError as err:
                    results[k].append(f"error: {err}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [res for per in results for res in per]
    assert len(flat) == CONNECTIONS * ROUNDS
    bad = [res for res in flat if res != (p.FRAME_TYPE_RESPONSE, b"OK")]
    assert not bad, f"{len(bad)} of {len(flat)} SUBs not answered OK: {bad[:5]}"
    log = "".join(server.lines)
    assert "RingLayoutError" not in log and "Traceback" not in log, log[-3000:]
