"""Shared-memory segments are published whole (nsqshm/_core/segment.py):
processes racing to create and attach the same ring, arena or ID segment
never see one half made, and a segment that is not what it claims gives a
clear error at once."""

import os
import stat
import time
import uuid

import posix_ipc
import pytest

from nsqshm._core import segment
from nsqshm._core.arena import Arena, ArenaError
from nsqshm._core.codec import IdGenerator
from nsqshm._core.ring import Ring, RingLayoutError

ROUNDS = 300


def names(kind):
    tag = uuid.uuid4().hex[:10]
    return [f"nsqshm-test-seg-{kind}-{tag}-{i}" for i in range(ROUNDS)]


def race(all_names, create, attach, creators=2, attachers=3):
    """Fork creators (each creates every name, the other may have won) and
    attachers (each spins on every name until it can attach); returns the
    failures each child reported."""
    r, w = os.pipe()
    pids = []
    for k in range(creators + attachers):
        pid = os.fork()
        if pid == 0:
            os.close(r)
            failures = []
            for name in all_names:
                deadline = time.monotonic() + 5
                while True:
                    try:
                        (create if k < creators else attach)(name).close()
                        break
                    except posix_ipc.ExistentialError:
                        if k < creators or time.monotonic() > deadline:
                            failures.append(f"{name}: not there")
                            break
                    except Exception as err:  # a half-made segment
                        failures.append(f"{name}: {type(err).__name__}: {err}")
                        break
            os.write(w, ("\n".join(failures) + "\n\0").encode())
            os._exit(0)
        pids.append(pid)
    os.close(w)
    out = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        out += chunk
    os.close(r)
    for pid in pids:
        os.waitpid(pid, 0)
    return [line for line in out.decode().replace("\0", "").splitlines() if line]


@pytest.fixture
def cleanup():
    made = []
    yield made
    for name in made:
        segment.unlink(name)


def test_rings_created_and_attached_at_once_are_always_whole(cleanup):
    all_names = names("ring")
    cleanup.extend(all_names)
    failures = race(all_names, lambda n: Ring.create(n, 4096, exist_ok=True), Ring.attach)
    assert not failures, failures[:5]
    ring = Ring.attach(all_names[-1])
    assert stat.S_IMODE(os.stat(f"/dev/shm/{all_names[-1]}").st_mode) == 0o600
    ring.close()


def test_arenas_created_and_attached_at_once_are_always_whole(cleanup):
    all_names = names("arena")
    cleanup.extend(all_names)

    def create(name):
        try:
            return Arena.create(name, size=1 << 16, max_queues=4)
        except posix_ipc.ExistentialError:
            return Arena.attach(name)  # the other creator won

    failures = race(all_names, create, Arena.attach)
    assert not failures, failures[:5]


def test_id_segments_opened_at_once_are_always_whole(cleanup):
    all_names = names("ids")[:100]
    cleanup.extend(all_names)
    failures = race(all_names, IdGenerator.open, IdGenerator.open)
    assert not failures, failures[:5]


def test_a_creator_that_dies_before_publishing_leaves_nothing(cleanup):
    (name,) = names("dead")[:1]
    cleanup.append(name)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        fd = segment.create(1 << 20)
        os.write(w, b"made")
        time.sleep(60)  # killed here, before publish
        os._exit(1)
    assert os.read(r, 4) == b"made"
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    os.close(r)
    os.close(w)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(".nsqshm-tmp-")]
    assert not os.path.exists(f"/dev/shm/{name}")
    # and the parent's own unpublished segment goes with discard
    fd = segment.create(1 << 20)
    segment.discard(fd)
    with pytest.raises(OSError):
        os.fstat(fd)


def test_publish_never_replaces_a_segment(cleanup):
    (name,) = names("once")[:1]
    cleanup.append(name)
    ring = Ring.create(name, 4096)
    with pytest.raises(posix_ipc.ExistentialError):
        Ring.create(name, 4096)
    assert Ring.create(name, 4096, exist_ok=True).capacity == 4096
    ring.close()


GARBAGE = [b"", b"\0" * 100, b"\0" * (1 << 16), os.urandom(1 << 16), b"\xff" * 4096]


@pytest.mark.parametrize("content", GARBAGE, ids=["empty", "zeros100", "zeros64k",
                                                  "random64k", "ones4k"])
def test_a_garbage_segment_is_refused_at_once_with_a_clear_error(cleanup, content):
    (name,) = names("garbage")[:1]
    cleanup.append(name)
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, content)
    os.close(fd)
    start = time.monotonic()
    with pytest.raises(RingLayoutError, match=name):
        Ring.attach(name)
    with pytest.raises(ArenaError, match=name):
        Arena.attach(name)
    with pytest.raises(ValueError, match=name):
        IdGenerator.open(name)
    assert time.monotonic() - start < 0.5  # no waiting for a header that never comes


def test_a_segment_name_that_is_not_a_file_is_refused(cleanup):
    (name,) = names("fifo")[:1]
    cleanup.append(name)
    os.mkfifo(f"/dev/shm/{name}", 0o600)
    with pytest.raises(RingLayoutError, match="not a shared-memory file"):
        Ring.attach(name)
    with pytest.raises(ArenaError, match="not a shared-memory file"):
        Arena.attach(name)
    with pytest.raises(ValueError, match="not a shared-memory file"):
        IdGenerator.open(name)


def test_without_o_tmpfile_a_hidden_name_is_used_and_removed(cleanup, monkeypatch):
    """Kernels or filesystems without O_TMPFILE: a hidden temporary name,
    linked the same way, never left behind."""
    monkeypatch.setattr(segment, "use_tmpfile", False)
    all_names = names("hidden")[:50]
    cleanup.extend(all_names)
    failures = race(all_names, lambda n: Ring.create(n, 4096, exist_ok=True), Ring.attach)
    assert not failures, failures[:5]
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(".nsqshm-tmp-")]
    assert stat.S_IMODE(os.stat(f"/dev/shm/{all_names[0]}").st_mode) == 0o600


def fifos_of(name):
    return sorted(n for n in os.listdir("/dev/shm")
                  if n.startswith(f"{name}.w") and stat.S_ISFIFO(os.lstat(f"/dev/shm/{n}").st_mode))


def test_a_handle_never_unlinks_the_ring_made_again_under_its_name(cleanup):
    """A topic deleted on one worker and made again there before the other
    worker applied the delete: the other worker's unlink, through its handle
    on the old ring, must leave the new ring (and its waiters' FIFOs) alone."""
    (name,) = names("again")[:1]
    cleanup.append(name)
    old = Ring.create(name, 4096)
    assert Ring.unlink_segment(name)  # the first worker's delete
    new = Ring.create(name, 4096)     # ... and its create, at once
    new.fileno()                      # a waiter on the new ring
    assert new.identity != old.identity and fifos_of(name)
    assert old.unlink() is False      # the other worker's delete, late
    assert Ring.attach(name).identity == new.identity
    assert fifos_of(name)
    new.push(b"kept")
    assert new.unlink() is True
    assert not os.path.exists(f"/dev/shm/{name}") and not fifos_of(name)
    assert new.pop() == b"kept"       # mapped handles keep working
    old.close()
    new.close()


def test_unlinks_racing_creates_remove_only_the_segment_in_hand(cleanup, tmp_path):
    """Processes that each create (or attach) one ring, then delete it
    through their handle, over and over: each segment's name is removed
    once, by a handle on that segment.  (An unlink by name made a late
    handle remove a newer segment: its own segment was then counted as
    removed twice, and the newer one never.)"""
    (name,) = names("churn")[:1]
    cleanup.append(name)
    pids = []
    for k in range(4):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                lines = []
                for _ in range(300):
                    ring = Ring.create(name, 4096, exist_ok=True)
                    dev, ino = ring.identity
                    lines.append(f"{dev}:{ino} {int(ring.unlink())}")
                    ring.close()
                (tmp_path / str(k)).write_text("\n".join(lines))
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    removed = {}
    for k in range(4):
        for line in (tmp_path / str(k)).read_text().splitlines():
            seg, ok = line.split()
            removed[seg] = removed.get(seg, 0) + int(ok)
    assert len(removed) > 100  # segments were made again and again
    twice = {seg: n for seg, n in removed.items() if n > 1}
    assert not twice, f"{len(twice)} segments removed more than once"
    assert sum(removed.values()) == len(removed)
