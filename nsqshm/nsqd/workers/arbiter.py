"""The supervisor of `nsqshm start` (after gunicorn's arbiter).

It reserves the listening ports, forks --workers worker processes (each
one nsqd over the shared rings, see worker.py), restarts a worker that
dies, and stops them all gracefully.

- Signal handlers only queue the signal and write a byte to a pipe; the
  main loop wakes on that pipe and on each worker's control socket and
  dispatches handle_<signal>.
- Nothing process-wide happens here before fork: no gevent, no threads, no
  shared memory; a worker sets all that up in its own process.
- Dead workers are reaped with a non-blocking waitpid loop.
- A worker that dies before it is ready stops the broker with a named exit
  code instead of a crash loop; so do CRASH_LIMIT workers in a row dying
  within BOOT_GRACE of starting.  A worker killed after it ran a while is
  simply replaced.
- Liveness: a worker sends "hb" every HEARTBEAT seconds and is killed
  after WORKER_TIMEOUT of silence (a hung event loop), then replaced.
- Graceful stop (SIGTERM, SIGINT): every worker closes its clients and puts
  its in-flight messages back ("stop" -> "phase1"); only then do the topic
  owners write the rings to disk ("phase2"); after --graceful-timeout the
  rest are SIGKILLed (their messages stay in shared memory for the next
  start).

Worker -> supervisor lines: ready, hb, phase1.  Supervisor -> worker lines:
stop, phase2, reload.
"""

import os
import secrets
import select
import signal
import socket
import time

EXIT_OK = 0
EXIT_FATAL = 1            # a worker could not start (it logged why)
EXIT_USAGE = 2
EXIT_CRASH_LOOP = 4       # workers kept dying just after they had started

HEARTBEAT = 5.0
# tests shorten the silence a hung worker is allowed (and its heartbeat with it)
WORKER_TIMEOUT = float(os.environ.get("NSQSHM_WORKER_TIMEOUT", "30"))
HEARTBEAT = min(HEARTBEAT, WORKER_TIMEOUT / 3)
BOOT_TIMEOUT = 60.0
BOOT_GRACE = 5.0          # a worker dying this soon after it was ready died at boot
CRASH_LIMIT = 5           # this many boot deaths in a row: stop

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)
SIG_NAMES = {s: s.name[3:].lower() for s in SIGNALS}


def set_proctitle(title):
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


class Worker:
    def __init__(self, index, pid, sock):
        self.index = index
        self.pid = pid
        self.sock = sock
        self.born = time.monotonic()
        self.last_seen = self.born
        self.ready = False
        self.ready_at = 0.0
        self.phase1 = False
        self.buf = b""


class Arbiter:
    def __init__(self, opts, argv, log, worker_main, reparse):
        self.opts = opts
        self.argv = argv
        self.log = log
        self.worker_main = worker_main
        self.reparse = reparse
        self.nworkers = opts.workers or os.cpu_count() or 1
        self.workers = {}          # pid -> Worker
        self.signals = []
        self.reserved = []
        self.stopping = False
        self.stop_deadline = None
        self.sent_phase2 = False
        self.booted = False
        self.boot_deaths = 0
        self.exit_code = EXIT_OK
        self.addresses = {}

    # -- set-up ------------------------------------------------------------------------

    def reserve_ports(self):
        from nsqshm.nsqd.options import listen_address_kind
        from nsqshm.nsqd.workers.listeners import reserve

        for key in ("tcp_address", "http_address", "https_address"):
            address = getattr(self.opts, key)
            if not address or (key == "https_address" and not self.opts.tls_cert) \
                    or listen_address_kind(address) == "unix":  # worker 0 binds a path
                continue
            sock, real = reserve(address)
            self.reserved.append(sock)
            self.addresses[key] = real
        # what the workers bind (the flags keep what was asked, for /config)
        self.opts.bound = dict(self.addresses)
        # cluster mode: how the workers know each other on the RPC port (a PUB that
        # landed on a worker goes to the partition's owner), which another process
        # on the host cannot say (consistence/rpc.py HELLO)
        self.opts.node_secret = secrets.token_hex(16)

    def install_signals(self):
        self.pipe_r, self.pipe_w = os.pipe()
        for fd in (self.pipe_r, self.pipe_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        for sig in SIGNALS:
            signal.signal(sig, self._queue_signal)
        signal.set_wakeup_fd(self.pipe_w)

    def _queue_signal(self, signum, frame):  # only queue: the main loop acts
        if len(self.signals) < 10:
            self.signals.append(signum)

    # -- workers -----------------------------------------------------------------------

    def spawn(self, index):
        parent, child = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            code = EXIT_FATAL
            try:
                parent.close()
                for w in self.workers.values():
                    w.sock.close()
                for s in self.reserved:
                    s.close()
                signal.set_wakeup_fd(-1)
                for sig in SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                os.close(self.pipe_r)
                os.close(self.pipe_w)
                code = self.worker_main(self.opts, index, self.nworkers, child, self.log)
            except BaseException as err:  # never return into the supervisor's loop
                try:
                    self.log.fatal(f"worker {index}: {err!r}")
                except Exception:
                    pass
            finally:
                os._exit(code if isinstance(code, int) else EXIT_FATAL)
        child.close()
        parent.setblocking(False)
        self.workers[pid] = Worker(index, pid, parent)
        return pid

    def send(self, worker, line):
        try:
            worker.sock.send(line.encode() + b"\n")
        except OSError:
            pass

    def read_worker(self, worker):
        try:
            data = worker.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            return
        worker.last_seen = time.monotonic()
        worker.buf += data
        while b"\n" in worker.buf:
            line, worker.buf = worker.buf.split(b"\n", 1)
            cmd = line.decode(errors="replace").strip()
            if cmd == "ready":
                worker.ready = True
                worker.ready_at = time.monotonic()
            elif cmd == "phase1":
                worker.phase1 = True

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self.workers.pop(pid, None)
            if worker is None:
                continue
            self.read_worker(worker)  # a "ready" sent just before dying counts
            worker.sock.close()
            self.worker_exited(worker, status)

    def worker_exited(self, worker, status):
        if os.WIFSIGNALED(status):
            how = f"was killed by signal {os.WTERMSIG(status)}"
        else:
            how = f"exited with code {os.WEXITSTATUS(status)}"
        if self.stopping:
            return
        if not worker.ready:
            self.log.error(f"worker {worker.index} (pid {worker.pid}) {how} before it was "
                           f"ready; stopping")
            self.exit_code = EXIT_FATAL
            self.begin_stop()
            return
        if time.monotonic() - worker.ready_at < BOOT_GRACE:
            self.boot_deaths += 1
        else:
            self.boot_deaths = 0  # killed after it ran a while: not a crash loop
        if self.boot_deaths >= CRASH_LIMIT:
            self.log.fatal(f"worker {worker.index} (pid {worker.pid}) {how}: {self.boot_deaths} "
                           f"workers in a row died within {BOOT_GRACE:.0f}s of starting; stopping")
            self.exit_code = EXIT_CRASH_LOOP
            self.begin_stop()
            return
        self.log.error(f"worker {worker.index} (pid {worker.pid}) {how}; starting a new one")
        self.spawn(worker.index)

    def check_liveness(self):
        now = time.monotonic()
        for w in list(self.workers.values()):
            limit = WORKER_TIMEOUT if w.ready else BOOT_TIMEOUT
            if now - w.last_seen > limit:
                self.log.error(f"worker {w.index} (pid {w.pid}) silent for "
                               f"{now - w.last_seen:.0f}s; killing it")
                self.kill(w.pid, signal.SIGKILL)
                w.last_seen = now

    @staticmethod
    def kill(pid, sig):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    # -- signals -------------------------------------------------------------------------

    def handle_term(self):
        self.begin_stop()

    handle_int = handle_term

    def handle_chld(self):
        self.reap()

    def handle_hup(self):
        """Reload the config file: workers re-read it and apply what can change
        while running (nsqd's options that PUT /config may change)."""
        try:
            self.reparse(self.argv)
        except Exception as err:
            self.log.error(f"SIGHUP: config not reloaded - {err}")
            return
        self.log.info("SIGHUP: reloading the configuration in every worker")
        for w in self.workers.values():
            self.send(w, "reload")

    def begin_stop(self):
        if self.stopping:
            return
        self.stopping = True
        self.stop_deadline = time.monotonic() + self.opts.graceful_timeout
        for w in self.workers.values():
            self.send(w, "stop")

    def advance_stop(self):
        """phase1 from every worker (or its death), then phase2; SIGKILL at the deadline."""
        if not self.sent_phase2 and all(w.phase1 for w in self.workers.values()):
            self.sent_phase2 = True
            for w in self.workers.values():
                self.send(w, "phase2")
        if self.workers and time.monotonic() > self.stop_deadline:
            self.log.error(f"{len(self.workers)} worker(s) still running after "
                           f"{self.opts.graceful_timeout}s; SIGKILL (their messages stay in "
                           f"shared memory for the next start)")
            for pid in list(self.workers):
                self.kill(pid, signal.SIGKILL)
            self.stop_deadline = time.monotonic() + 5

    # -- the main loop -------------------------------------------------------------------

    def run(self, on_ready):
        self.reserve_ports()
        self.install_signals()
        for index in range(self.nworkers):
            self.spawn(index)
        while self.workers or not self.stopping:
            timeout = 0.2 if self.stopping else HEARTBEAT
            socks = {w.sock.fileno(): w for w in self.workers.values()}
            try:
                readable, _, _ = select.select([self.pipe_r, *socks], [], [], timeout)
            except InterruptedError:
                readable = []
            if self.pipe_r in readable:
                try:
                    while os.read(self.pipe_r, 64):
                        pass
                except BlockingIOError:
                    pass
            for fd in readable:
                if fd in socks:
                    self.read_worker(socks[fd])
            while self.signals:
                getattr(self, f"handle_{SIG_NAMES[self.signals.pop(0)]}")()
            self.reap()
            if self.stopping:
                self.advance_stop()
                continue
            if not self.booted and self.workers and all(w.ready for w in self.workers.values()) \
                    and len(self.workers) == self.nworkers:
                self.booted = True
                on_ready(self)
            self.check_liveness()
        for s in self.reserved:
            s.close()
        return self.exit_code

