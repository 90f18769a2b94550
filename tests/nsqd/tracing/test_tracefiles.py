"""The trace logs' files (nsqshm/nsqd/tracing/tracefiles.py): which logs a search
reads, and the pruning of exited local processes' logs."""

import fcntl
import os
import subprocess
import sys

from nsqshm.nsqd.tracing.tracefiles import append_stream, log_files, prune_local, read_streams


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write(path, size, mtime):
    with open(path, "wb") as f:
        f.write(b"x" * size)
    os.utime(path, ns=(mtime, mtime))


def test_log_files_are_the_workers_and_the_local_processes(tmp_path):
    append_stream(tmp_path / "w0.streams", 1, "t", "")
    append_stream(tmp_path / "w1.streams", 1, "t", "c")
    append_stream(tmp_path / "l123.streams", 1, "t", "c")
    append_stream(tmp_path / "l123.streams", 2, "u", "")
    for junk in ("x1.streams", "wx.streams", "l12.events", "switches.json"):
        (tmp_path / junk).write_bytes(b"")
    found = [(os.path.basename(p), who, table) for p, table, who in log_files(str(tmp_path))]
    assert found == [
        ("l123.events.1", "shm:123", {1: ("t", "c"), 2: ("u", "")}),
        ("l123.events", "shm:123", {1: ("t", "c"), 2: ("u", "")}),
        ("w0.events.1", 0, {1: ("t", "")}),
        ("w0.events", 0, {1: ("t", "")}),
        ("w1.events.1", 1, {1: ("t", "c")}),
        ("w1.events", 1, {1: ("t", "c")}),
    ]
    assert read_streams(tmp_path / "missing.streams") == {}


def test_prune_removes_exited_processes_logs_oldest_first(tmp_path):
    """Exited: its table is not locked (a live local process holds a shared
    flock on it, whatever its pid namespace)."""
    old, new, alive = dead_pid(), dead_pid(), os.getpid()
    for pid, mtime in ((old, 1_000), (new, 2_000), (alive, 500)):
        write(tmp_path / f"l{pid}.events", 600, mtime)
        write(tmp_path / f"l{pid}.events.1", 400, mtime)
        write(tmp_path / f"l{pid}.streams", 10, mtime)
    write(tmp_path / "w0.events", 5000, 1)
    held = os.open(tmp_path / f"l{alive}.streams", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)
    # the two exited processes hold 2 x 1010 bytes: keeping 1500 drops the older
    assert prune_local(str(tmp_path), keep_bytes=1500) == 1
    names = set(os.listdir(tmp_path))
    assert not any(n.startswith(f"l{old}.") for n in names)
    assert {f"l{new}.events", f"l{alive}.events", "w0.events"} <= names
    assert prune_local(str(tmp_path), keep_bytes=1500) == 0
    assert prune_local(str(tmp_path), keep_bytes=0) == 1  # never the live process's
    assert f"l{alive}.events" in os.listdir(tmp_path)
    os.close(held)  # the process is gone: its log may go too
    assert prune_local(str(tmp_path), keep_bytes=0) == 1
    assert not any(n.startswith("l") for n in os.listdir(tmp_path))
    assert prune_local(str(tmp_path / "nothing")) == 0
