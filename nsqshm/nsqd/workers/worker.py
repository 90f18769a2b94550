"""One worker process of `nsqshm start` (forked by arbiter.py).

The worker sets up everything process-wide itself, after the fork: gevent's
monkey patching, its shared-memory arena, its listening sockets (SO_REUSEPORT
on the ports the supervisor reserved).  It talks to the supervisor over a
socketpair: "ready" once listening, "hb" every HEARTBEAT seconds, "phase1"
when its clients are closed on "stop"; on "phase2" the topic owners write
the rings to disk and the worker exits.

It dies with the supervisor (PR_SET_PDEATHSIG, SIGKILL): a worker left
alone would serve without anyone to restart it.  Its messages are in shared
memory for the next start.  SIGTERM sent to a worker alone stops just that
worker, gracefully; the supervisor starts another.
"""

import ctypes
import os
import signal

from nsqshm import NSQD_COMPAT_VERSION
from nsqshm.consistence.options import cluster_mode
from nsqshm.nsqd.workers.arbiter import EXIT_FATAL, EXIT_OK, HEARTBEAT, set_proctitle

PR_SET_PDEATHSIG = 1
# glibc's mallopt: a buffer below MMAP_THRESHOLD comes from the heap, and the heap keeps up to
# TRIM_THRESHOLD of freed memory at its top (glibc's defaults adapt: a freed 4 MiB MPUB
# buffer went back to the kernel and the next one was faulted in again, page by page: a
# third of a worker's time publishing 64 KiB messages; bench/RESULTS.md, issue 20)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
TRIM_THRESHOLD = 32 << 20
MMAP_THRESHOLD = 8 << 20  # above --max-body-size's default (5 MiB) and a read's 256 KiB
FAULT_CRASH_ENV = "NSQSHM_FAULT_WORKER_CRASH"  # seconds after ready (tests)


def die_with_parent():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the supervisor died before prctl took effect
        os._exit(EXIT_FATAL)


def keep_freed_memory():
    """Large buffers (an MPUB's, a read's) from the heap, and freed heap memory
    kept for the next one, up to TRIM_THRESHOLD."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except (OSError, AttributeError):
        pass  # not glibc


def main(opts, index, nworkers, ctl, log):
    set_proctitle(f"nsqshm: worker {index} (data {os.path.abspath(opts.data_path or '.')})")
    die_with_parent()
    keep_freed_memory()
    from nsqshm.greenlets import patch_all

    patch_all()
    import socket

    import gevent
    import gevent.event

    from nsqshm.nsqd.logtopics.replica import ReplicaHost
    from nsqshm.nsqd.nsqd import NSQD
    from nsqshm.nsqd.workers.memdump import install as install_memory_dump

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C: the supervisor decides
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=ctl.detach())
    done = gevent.event.Event()
    alone = gevent.event.Event()
    gevent.signal_handler(signal.SIGTERM, alone.set)  # handlers only queue

    def send(line):
        try:
            ctl.sendall(line.encode() + b"\n")
        except OSError:
            alone.set()

    nsqd = NSQD(opts, log=log, index=index, workers=nworkers)
    nsqd.publish_instance = False  # the supervisor's
    # cluster mode: every log partition refuses writes until its role is known
    host = ReplicaHost(nsqd) if cluster_mode(opts) else None
    try:
        nsqd.start()
    except (OSError, RuntimeError) as err:
        log.fatal(f"failed to start nsqd - {err}")
        nsqd.close_arena()
        return EXIT_FATAL
    coordinator = None
    if host is not None:  # etcd, roles, replication: nsqshm/consistence/
        from nsqshm.consistence.nsqd_coordinator import NsqdCoordinator

        try:
            coordinator = NsqdCoordinator(host, opts, nsqd.logf, NSQD_COMPAT_VERSION).start()
        except OSError as err:
            log.fatal(f"failed to listen on --rpc-port - {err}")
            nsqd.stop(alone=True)
            return EXIT_FATAL
    install_memory_dump(nsqd)  # NSQSHM_MEMORY_DUMP: SIGUSR2 dumps (memdump.py)
    send("ready")

    def heartbeat():
        while True:
            gevent.sleep(HEARTBEAT)
            send("hb")

    def commands():
        f = ctl.makefile("rb")
        for raw in f:
            cmd = raw.decode(errors="replace").strip()
            if cmd == "stop":
                if coordinator is not None:  # leaderships handed off first
                    coordinator.close()
                nsqd.stop_clients()
                send("phase1")
            elif cmd == "phase2":
                try:
                    nsqd.stop_queues()
                except Exception as err:  # a defect must not hang the stop: what was not
                    # written to disk stays in shared memory for the next start
                    log.error(f"worker {index}: graceful stop failed - {err!r}; "
                              "what it did not write stays in shared memory")
                finally:
                    done.set()
                return
            elif cmd == "reload":
                reload_options(nsqd, log)
        alone.set()  # the supervisor is gone

    workers = [gevent.spawn(heartbeat), gevent.spawn(commands)]
    crash_after = os.environ.get(FAULT_CRASH_ENV)
    if crash_after:  # fault injection (tests): die at once, as a segfault would
        gevent.spawn_later(float(crash_after), os._exit, 70)
    gevent.wait([done, alone], count=1)
    if alone.is_set() and not done.is_set():
        log.info(f"worker {index}: stopping alone")
        if coordinator is not None:
            coordinator.close()
        nsqd.stop(alone=True)
    for g in workers:
        g.kill(block=False)
    return EXIT_OK


def reload_options(nsqd, log):
    """SIGHUP: re-read the flags and config file; apply what may change while
    running (what nsqd's PUT /config allows: lookupd addresses, log level).
    The supervisor tells every worker, so each applies it for itself."""
    from nsqshm.nsqd.nsqd import RUNTIME_OPTIONS
    from nsqshm.nsqd.options import OptionsError, parse_args

    try:
        fresh = parse_args(list(nsqd.opts.argv))
    except OptionsError as err:
        log.error(f"reload: {err}")
        return
    nsqd.apply_options({key: getattr(fresh, key) for key in RUNTIME_OPTIONS})
    log.warn(f"reload: configuration re-read (log level {nsqd.opts.log_level})")
