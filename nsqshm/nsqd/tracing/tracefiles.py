"""The files of the trace logs (trace.py has the design), shared by the
broker's workers and the local clients (nsqshm/local/tracing.py), which
write logs of their own beside the workers':

    <data-path>/nsqshm.trace/w<index>.events     a worker's events (.events.1: older)
    <data-path>/nsqshm.trace/w<index>.streams    {"stream":n,"topic":"t","channel":"c"} a line
    <data-path>/nsqshm.trace/l<pid>.events       a local consumer process's, .streams the same
    <data-path>/nsqshm.trace/switches.json       [[topic, channel or ""], ...] with tracing on

No gevent here: a local client imports this."""

import fcntl
import json
import os

TRACE_DIR = "nsqshm.trace"
SWITCHES = "switches.json"
MAX_LOG_BYTES = 64 << 20        # a worker's events file past this becomes .1
LOCAL_MAX_LOG_BYTES = 8 << 20   # a local process's
LOCAL_KEEP_BYTES = 256 << 20    # the logs of local processes that exited, kept at most
WORKER, LOCAL = "w", "l"


def trace_dir(data_path):
    return os.path.join(data_path, TRACE_DIR)


def read_streams(path):
    """{number: (topic, channel)} of a log's stream table (a torn last line skipped)."""
    table = {}
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    e = json.loads(line)
                    table[int(e["stream"])] = (str(e["topic"]), str(e.get("channel", "")))
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return table


def append_stream(path, ref, topic, channel):
    """Add (topic, channel) as number `ref` to a log's stream table."""
    line = json.dumps({"stream": ref, "topic": topic, "channel": channel},
                      separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_switches(directory):
    """{(topic, channel or "")} with tracing on, as last written."""
    try:
        with open(os.path.join(directory, SWITCHES)) as f:
            return {(str(t), str(c)) for t, c in json.load(f)}
    except (OSError, ValueError, TypeError):
        return set()


def switches_mtime(directory):
    try:
        return os.stat(os.path.join(directory, SWITCHES)).st_mtime_ns
    except OSError:
        return 0


def log_files(directory):
    """(events file, its stream table, who wrote it) of every log, the older
    part first: who is a worker's index, or "shm:<pid>" for a local process."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    for name in names:
        kind, number = name[:1], name[1:-len(".streams")]
        if kind not in (WORKER, LOCAL) or not name.endswith(".streams") or not number.isdigit():
            continue
        table = read_streams(os.path.join(directory, name))
        who = int(number) if kind == WORKER else f"shm:{number}"
        for part in (f"{kind}{number}.events.1", f"{kind}{number}.events"):
            yield os.path.join(directory, part), table, who


def prune_local(directory, keep_bytes=LOCAL_KEEP_BYTES):
    """Remove the logs of local processes that exited, oldest first, until
    what is left of them is at most keep_bytes (the workers' logs rotate by
    themselves; a local process's only while it runs)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    done = []
    for name in names:
        if not (name.startswith(LOCAL) and name.endswith(".streams")):
            continue
        pid = name[1:-len(".streams")]
        if not pid.isdigit() or _in_use(os.path.join(directory, name)):
            continue
        paths = [os.path.join(directory, f"{LOCAL}{pid}{end}")
                 for end in (".events", ".events.1", ".streams")]
        size, newest = 0, 0
        for path in paths:
            try:
                st = os.stat(path)
            except OSError:
                continue
            size += st.st_size
            newest = max(newest, st.st_mtime_ns)
        done.append((newest, size, paths))
    total = sum(size for _, size, _ in done)
    removed = 0
    for _, size, paths in sorted(done):
        if total <= keep_bytes:
            break
        for path in paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        total -= size
        removed += 1
    return removed


def _in_use(streams_path):
    """Whether the process that writes this log still runs: it holds a shared
    flock on its table while it lives (nsqshm/local/tracing.py), whatever its
    pid namespace and however pids are reused."""
    try:
        fd = os.open(streams_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True  # (gone meanwhile, or not ours to look at: leave it)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
