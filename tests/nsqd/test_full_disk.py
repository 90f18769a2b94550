"""A full disk never loses an acknowledged message (topic.py, channel.py,
overflow.py): on a real small filesystem that fills, a PUB is stored or
answered E_PUB_FAILED, /ping says NOK on every worker, and once space
returns publishing resumes by itself and every message answered OK is
delivered.

The data path is a 20 MB tmpfs mounted in the server's own mount namespace
(`unshare -m`, as root): the host's mount table never sees it, and it goes
away with the server's processes.  The test reaches it through
/proc/<server pid>/root.
"""

import errno
import os
import shutil
import time
import urllib.error

import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for
from tests.nsqd.workers.test_workers import Client

BODY = b"z" * 1000

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="mounting a tmpfs in a mount namespace needs root and unshare")


def small_disk_server(nsqd_factory, tmp_path, *args):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mount = 'mount -t tmpfs -o size=20m,mode=0700 nsqshm-test "$0" && exec "$@"'
    wrap = ["unshare", "-m", "--propagation", "private", "sh", "-c", mount, str(mnt)]
    server = nsqd_factory(*args, data_path=mnt, wrap=wrap)
    # the tmpfs as the server sees it (the host sees the empty directory)
    server.disk = f"/proc/{server.proc.pid}/root{mnt}"
    assert os.path.exists(f"{server.disk}/nsqd.dat")
    return server


def fill(path):
    """Write a filler file until the filesystem is full; returns its size."""
    size = 0
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            data = b"\0" * chunk
            while True:
                try:
                    f.write(data)
                except OSError as err:
                    assert err.errno == errno.ENOSPC
                    break
                size += chunk
    return size


def ping(server):
    try:
        return server.get("/ping")[1].decode()
    except urllib.error.HTTPError as err:
        return err.read().decode()


def publish_pipelined(server, topic, start, n, batch=100):
    """PUB numbered bodies, `batch` in flight per connection; returns (bodies
    answered OK, errors).  An E_PUB_FAILED closes the connection (nsqd's
    fatal error): the PUBs after it on that connection got no answer."""
    ok, errors = [], []
    seq = start
    c = None
    while seq < start + n:
        if c is None:
            c = Client(server, timeout=10)
        bodies = [b"%09d:" % i + BODY for i in range(seq, min(seq + batch, start + n))]
        seq += len(bodies)
        c.send(b"".join(p.pub(topic, b) for b in bodies))
        for body in bodies:
            try:
                kind, data = c.response()
            except (OSError, ConnectionError):
                c.close()
                c = None
                break
            if data == b"OK":
                ok.append(body)
            else:
                errors.append(data)
    if c is not None:
        c.close()
    return ok, errors


def consume(server, topic, channel, want, timeout=60):
    c = Client(server, timeout=timeout)
    c.send(p.sub(topic, channel))
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.send(p.rdy(2000))
    seen = set()
    deadline = time.monotonic() + timeout
    try:
        while not want <= seen and time.monotonic() < deadline:
            msg = c.message()
            c.send(p.fin(msg.id))
            seen.add(msg.body)
    except TimeoutError:
        pass
    c.close()
    return seen


@pytest.mark.parametrize("mem", ["0", "10000"], ids=["mem0", "memdefault"])
@pytest.mark.parametrize("channel", [True, False], ids=["channel", "nochannel"])
@pytest.mark.parametrize("workers", [1, 2], ids=["workers1", "workers2"])
def test_full_disk_loses_no_acknowledged_message(nsqd_factory, tmp_path, workers, channel, mem):
    server = small_disk_server(nsqd_factory, tmp_path, f"--workers={workers}",
                               f"--mem-queue-size={mem}", "--max-msg-size=65536",
                               "--sync-timeout=100ms")
    topic = "full"
    assert server.post(f"/topic/create?topic={topic}")[0] == 200
    if channel:
        assert server.post(f"/channel/create?topic={topic}&channel=c")[0] == 200
    wait_for(lambda: os.path.exists(f"/dev/shm/{server.prefix}.t.{topic}"))
    filler = f"{server.disk}/filler"
    filled = fill(filler)

    # publish until the broker refuses, then on: every answer is OK or E_PUB_FAILED
    sent, errors = [], []
    seq = 0
    started = time.monotonic()
    while not errors and time.monotonic() - started < 20:
        ok, errs = publish_pipelined(server, topic, seq, 2000)
        seq += 2000
        sent += ok
        errors += errs
    assert errors, f"{len(sent)} PUBs answered OK on a full disk and none failed"
    more, errs = publish_pipelined(server, topic, seq, 300, batch=10)
    seq += 300
    sent += more
    errors += errs
    assert all(e.startswith(b"E_PUB_FAILED") for e in errors), set(errors)
    pings_full = {ping(server) for _ in range(10)}
    print(f"\nfull disk ({filled >> 10} KiB filler): {len(sent)} PUBs answered OK, "
          f"{len(errors)} E_PUB_FAILED ({errors[0][:80]!r}); /ping {pings_full}")
    assert all(p.startswith("NOK") for p in pings_full), pings_full

    # space returns: publishing resumes by itself, /ping says OK again
    os.unlink(filler)
    resumed_at = time.monotonic()
    after = []
    while len(after) < 100 and time.monotonic() - resumed_at < 10:
        ok, _ = publish_pipelined(server, topic, seq, 100 - len(after), batch=10)
        seq += 100
        after += ok
    assert len(after) == 100, "publishing did not resume once space returned"
    sent += after
    assert wait_for(lambda: all(ping(server) == "OK" for _ in range(10)), timeout=10)

    got = consume(server, topic, "c", set(sent))
    lost = set(sent) - got
    print(f"after freeing: {len(got)} delivered, {len(lost)} acknowledged lost")
    assert not lost, f"{len(lost)} of {len(sent)} acknowledged messages lost"
