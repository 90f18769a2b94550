"""The fuzzing run: seeded inputs (V2 command streams and HTTP requests)
against real nsqd (--workers 2), nsqlookupd and nsqadmin processes, from
several threads, every input checked by the oracle; every finding is kept
with its input, so a run reports all of them.

Input i of seed S is built from random.Random(f"{S}:{i}") alone: rerun one
with `python -m tests.fuzz.runner --seed S --only i`.

The oracle:
- a conversation ends (the server closes after the client's half-close)
  within its timeout;
- every frame is a known answer (OK, CLOSE_WAIT, an IDENTIFY response) or
  an E_* code of nsqd's; the commands before the first mutated byte get
  the answers nsqd's source defines (v2_inputs), and nothing follows a
  fatal one;
- a client never receives a message of a topic it did not subscribe to
  (bodies are tagged), nor a message without having subscribed; the
  witness subscribers get every message published to their topics and
  only those;
- HTTP: every request is answered (when whole), never with a 5xx (save
  nsqd's /ping NOK and nsqadmin's 502 for an unreachable upstream);
- no process dies or changes (the pids of every server process), no
  Traceback in any log (nor a handler's panic, a FATAL line...);
- memory stays bounded: the servers' heap (anonymous resident pages of
  every process) grows after the warm-up by less than HEAP_SLACK plus
  PER_QUEUE for each topic and channel that appeared since (mutations make
  new valid names: a topic or channel is kept until deleted, as in nsqd);
  the rings in /dev/shm are those of the broker's topics and channels, no
  more and no fewer, and no process maps a ring whose name is gone or
  another's.  (RSS counts a ring's pages in every process that touched
  them, and grows with what the rings hold: it is reported, not bounded.)
"""

import argparse
import random
import re
import socket
import sys
import tempfile
import threading
import time
from urllib.parse import parse_qs, unquote, urlsplit

from .cluster import Cluster, Witness
from .conversation import read_to_end, send_and_half_close, talk
from .http_inputs import ADMIN, LOOKUPD, NSQD, HttpGenerator
from .v2_inputs import ANSWERS, ERROR_CODES, NAMES, Generator, Limits, Stream, mutate, untag

HEAP_SLACK = (1.10, 32 << 20)  # final heap <= warm-up heap * 1.10 + 32 MiB + ...
PER_QUEUE = 100_000  # ... + 100 KB per new topic or channel (issue 21's target for an idle one)
HTTP_STATUS = re.compile(rb"^HTTP/1\.[01] (\d{3})")
# handlers whose body read error is a 500 in Go (nsqd's doPUB, doMPUB, doConfig;
# nsqadmin's doConfig): a body cut short gets it from nsqd too
GO_500_ON_SHORT_BODY = {"nsqd": ("/pub", "/mpub", "/config"), "nsqadmin": ("/config",)}
# what a server logs when it fails inside (nsqd's router panic handler, a failed
# operation, a fatal error): reported with the line, which says why
LOG_ERROR = re.compile(r"panic in HTTP handler|failure in /|FATAL:|failed to apply")


class Finding:
    def __init__(self, kind, detail, index=None, data=None):
        self.kind, self.detail, self.index, self.data = kind, detail, index, data

    def __str__(self):
        where = f" input {self.index}" if self.index is not None else ""
        shown = ""
        if self.data is not None:
            shown = "\n    input: " + (repr(self.data) if len(self.data) <= 600
                                       else repr(self.data[:400]) + f" ... ({len(self.data)} bytes)")
        return f"[{self.kind}]{where}: {self.detail}{shown}"


# a log line of a server: another worker's lines interleave with a traceback
LOG_LINE = re.compile(r"^\[(nsqd|nsqlookupd|nsqadmin)\] \d{4}/")


def traceback_end(lines, start):
    """The index past a traceback starting at lines[start]: past the
    exception's own line (the first unindented one after a frame that is not
    another process's log line), chained tracebacks included."""
    i = start + 1
    while i < len(lines):
        line = lines[i]
        if line.startswith((" ", "\t", "Traceback", "\n")) or not line.strip() \
                or LOG_LINE.match(line):
            i += 1
        elif line.startswith(("During handling", "The above exception")):
            i += 1
        else:
            i += 1  # the exception line
            if i < len(lines) and (lines[i].startswith(("\n", "During", "The above")) or
                                   not lines[i].strip()):
                continue  # a chained one follows
            return i
    return i


def http_exchange(address, data, timeout):
    """Send a raw request, half-close, read to the end: (response bytes, hung)."""
    sock = socket.create_connection(address, timeout=timeout)
    out = bytearray()
    start = time.monotonic()
    try:
        send_and_half_close(sock, data)
        hung = read_to_end(sock, out, start, timeout)
    finally:
        sock.close()
    return bytes(out), hung


class Run:
    def __init__(self, cluster, seed, limits, timeout=10.0, names=NAMES):
        self.names = names
        self.cluster = cluster
        self.seed = seed
        self.limits = limits
        self.timeout = timeout
        self.findings = []
        self.deletes = {}  # topic (bytes) -> when an input last deleted it or a channel of it
        self.counts = {"tcp": 0, "http": 0, "commands": 0, "mutated": 0}
        self.lock = threading.Lock()

    def find(self, *args):
        with self.lock:
            self.findings.append(Finding(*args))

    # -- one input ----------------------------------------------------------------------

    def one(self, index):
        rng = random.Random(f"{self.seed}:{index}")
        if rng.random() < 0.8:
            self.tcp_input(index, rng)
        else:
            self.http_input(index, rng)

    def tcp_input(self, index, rng):
        gen = Generator(self.limits, self.names)
        gen.nonce = index * 1000
        stream = gen.generate(rng)
        data = stream.data
        cut = len(data)
        if rng.random() < 0.4 and stream.expect[0][1] != "E_BAD_PROTOCOL":
            data, cut = mutate(rng, data, self.limits)
        chunk = None
        if rng.random() < 0.04:  # bodies and lines split over many writes
            chunk = rng.choice([1, 2, 7]) if len(data) < 1500 else rng.choice([100, 1000])
        linger = 0.0
        if rng.random() < 0.005:  # a connection that sends the magic only must get nothing
            stream = Stream()
            data, cut, linger = stream.data, len(stream.data), 0.2
        started = time.monotonic()
        answer = talk(self.cluster.nsqd.tcp, data, self.timeout, chunk, linger)
        if stream.topic is not None and self.deleted_during(stream.topic, started):
            # another input deleted its topic or channel meanwhile: nsqd closes a
            # deleted channel's clients too, so the answers may end early
            stream.interrupted = True
        with self.lock:
            self.counts["tcp"] += 1
            self.counts["commands"] += len(stream.expect)
            self.counts["mutated"] += cut < len(stream.data)
        self.check_tcp(index, stream, data, cut, answer)

    def check_tcp(self, index, stream, data, cut, answer):
        if answer.hung:
            self.find("tcp-hang", f"no close within {self.timeout}s; got {answer.words}", index, data)
        words = answer.words
        unknown = [w for w in words if w not in ANSWERS and w not in ERROR_CODES]
        if unknown:
            self.find("tcp-unknown-answer", f"{unknown} in {words}", index, data)
        known = [(a, fatal) for end, a, fatal in stream.expect if end <= cut]
        expected = [a for a, _ in known if a]
        complete = cut >= len(stream.data) or any(fatal for _, fatal in known)
        closed_early = len(words) < len(expected) and words == expected[:len(words)]
        if closed_early and getattr(stream, "interrupted", False):
            pass
        elif words[:len(expected)] != expected or (complete and words != expected):
            errors = [b.decode("latin-1")[:160] for t, b in answer.frames if t == 1]
            self.find("tcp-answer", f"nsqd answers {expected}{'' if complete else ' ...'}, "
                                    f"got {words} {errors if errors else ''}", index, data)
        for body in answer.messages:
            topic = untag(body)
            if stream.topic is None and b"SUB" not in data:
                self.find("tcp-foreign-message", f"a client that never subscribed got {body[:60]!r}",
                          index, data)
            elif topic is not None and stream.topic is not None and topic != stream.topic:
                self.find("tcp-foreign-message", f"subscribed to {stream.topic!r}, got a message "
                                                 f"of {topic!r}", index, data)

    def note_delete(self, daemon, method, path):
        """Remember when a topic (or one of its channels) was deleted through
        nsqd or nsqadmin: SUBs on it may be closed, as nsqd closes them."""
        topic = None
        if daemon == "nsqd" and "/delete" in path:
            topic = parse_qs(urlsplit(path).query).get("topic", [None])[0]
        elif daemon == "nsqadmin" and method == "DELETE" and path.startswith("/api/topics/"):
            topic = unquote(path.split("/")[3].split("?")[0])
        if topic is not None:
            with self.lock:
                self.deletes[topic.encode("utf-8", "surrogateescape")] = time.monotonic()

    def deleted_during(self, topic, started):
        with self.lock:
            when = self.deletes.get(topic)
        return when is not None and when >= started - 1.0

    def http_input(self, index, rng):
        cluster = self.cluster
        gen = HttpGenerator(self.limits, self.names)
        gen.nonce = index * 1000
        r = rng.random()
        if r < 0.6:
            name, table, address = "nsqd", NSQD, ("127.0.0.1", cluster.nsqd.http_port)
        elif r < 0.85:
            name, table, address = "nsqlookupd", LOOKUPD, ("127.0.0.1", cluster.lookupd.http_port)
        else:
            name, table, address = "nsqadmin", ADMIN, ("127.0.0.1", cluster.admin.port)
        data, method, path, short = gen.request(rng, table, cluster.node)
        self.note_delete(name, method, path)
        response, hung = http_exchange(address, data, self.timeout)
        # and when it was done: a delete through nsqadmin (lookupd, then each nsqd)
        # on a loaded machine can take longer than the window deleted_during allows
        self.note_delete(name, method, path)
        with self.lock:
            self.counts["http"] += 1
        if hung:
            self.find(f"http-hang {name}", f"no answer or close within {self.timeout}s "
                                           f"({response[:80]!r})", index, data)
            return
        m = HTTP_STATUS.match(response)
        if m is None:
            whole = b"\r\n\r\n" in data and data.startswith(method.encode() + b" ")
            if response or whole:
                self.find(f"http-no-answer {name}", f"answer {response[:120]!r}", index, data)
            return
        status = int(m.group(1))
        if status >= 500:
            body = response.split(b"\r\n\r\n", 1)[-1]
            if path == "/ping" and status == 500 and body.startswith(b"NOK"):
                return
            if name == "nsqadmin" and status == 502:
                return
            if status == 505 and body.startswith(b"505 HTTP Version Not Supported"):
                return  # Go's net/http for a version that is not HTTP/1.x
            if status == 501 and body == b"Unsupported transfer encoding":
                return  # Go's net/http for a Transfer-Encoding other than chunked
            if status == 500 and short and path.startswith(GO_500_ON_SHORT_BODY.get(name, ())):
                return  # nsqd's handler answers 500 when reading the body fails, as here
            self.find(f"http-{status} {name}", f"{method} {path}: {body[:200]!r}", index, data)

    # -- the whole run ------------------------------------------------------------------

    def run(self, inputs, threads=8, only=None, progress=None):
        cluster = self.cluster
        pids_before = set(cluster.processes())
        witnesses = [Witness(cluster.nsqd.tcp, b"fzw%d-%d" % (self.seed % 1000, i)) for i in range(2)]
        indices = [only] if only is not None else range(inputs)
        it = iter(indices)
        it_lock = threading.Lock()
        warm = max(1, len(indices) // 10)
        mem = {"warm": None, "max": {"heap": 0, "rss": 0, "shm": 0}}
        done = [0]
        stopped = threading.Event()
        start = time.monotonic()

        def work():
            while True:
                with it_lock:
                    index = next(it, None)
                    done[0] += 1
                    n = done[0]
                if index is None or stopped.is_set():
                    return
                try:
                    self.one(index)
                except Exception as err:  # every input is reported, whatever breaks
                    if isinstance(err, ConnectionRefusedError) or any(
                            p.poll() is not None
                            for p in (cluster.nsqd.proc, cluster.lookupd.proc, cluster.admin.proc)):
                        if not stopped.is_set():  # a server is gone: the rest would only repeat that
                            stopped.set()
                            self.find("server-gone", f"{err!r}: the run stops", index)
                        return
                    self.find("client-error", repr(err), index)
                if n % 97 == 0:
                    witnesses[n % 2].publish()  # a failure is reported at the end
                if n == warm:
                    mem["warm"] = cluster.memory()
                    mem["warm"]["queues"] = len(cluster.queues())
                if n % 5000 == 0:
                    now = cluster.memory()
                    mem["max"] = {k: max(v, now[k]) for k, v in mem["max"].items()}
                    if progress:
                        progress(f"{n} inputs, {time.monotonic() - start:.0f}s, "
                                 f"{len(self.findings)} findings")

        workers = [threading.Thread(target=work) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.monotonic() - start
        # the witnesses: every message published to their topics came, nothing else did
        for w in witnesses:
            deadline = time.monotonic() + 10
            while len(w.received) < w.published and time.monotonic() < deadline:
                time.sleep(0.05)
            w.close()
            if len(w.received) != w.published or w.foreign or w.failed:
                self.find("witness", f"{w.topic!r}: published {w.published}, received "
                                     f"{len(w.received)}, foreign {[m[:40] for m in w.foreign[:5]]}"
                                     f"{'; ' + w.failed if w.failed else ''}")
        final = self.check_memory(mem)
        for proc, name in ((cluster.nsqd.proc, "nsqd"), (cluster.lookupd.proc, "nsqlookupd"),
                           (cluster.admin.proc, "nsqadmin")):
            if proc.poll() is not None:
                tail = "".join(cluster.logs()[name][-30:])
                self.find("process-died", f"{name} exited with {proc.returncode}; its log ends:\n{tail}")
        pids_after = set(cluster.processes())
        if pids_after != pids_before:
            self.find("process-changed", f"server processes {sorted(pids_before)} -> {sorted(pids_after)}")
        for name, lines in cluster.logs().items():
            i = 0
            while i < len(lines):
                if "Traceback" in lines[i]:
                    end = traceback_end(lines, i)
                    shown = lines[max(0, i - 2):i] + [line for line in lines[i:end]
                                                      if not LOG_LINE.match(line)]
                    self.find(f"traceback {name}", "".join(shown))
                    i = end
                else:
                    if LOG_ERROR.search(lines[i]):
                        self.find(f"log-error {name}", lines[i].rstrip())
                    i += 1
        memory = {f"{k}_{when}_mib": round(m[k] / 2 ** 20, 1) for when, m in
                  (("warm", mem["warm"] or {}), ("final", final), ("max", mem["max"]))
                  for k in ("heap", "rss", "shm") if k in m}
        return {"inputs": self.counts["tcp"] + self.counts["http"], "stopped_early": stopped.is_set(),
                "seconds": elapsed, **memory,
                "queues_warm": (mem["warm"] or {}).get("queues"), "queues_final": final["queues"],
                **self.counts}

    def check_memory(self, mem, settle=10.0):
        """The memory oracle (module docstring); returns the final figures."""
        cluster = self.cluster
        # deletes that are still being applied (an ephemeral channel goes once its
        # last client has gone on every worker) settle first
        deadline = time.monotonic() + settle
        while True:
            queues, rings = cluster.queues(), cluster.rings()
            if queues == rings or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if rings - queues:
            self.find("shm-leak", f"rings in /dev/shm of no topic or channel: {sorted(rings - queues)[:20]}")
        if queues - rings:
            self.find("ring-missing", f"topics or channels without their ring in /dev/shm: "
                                      f"{sorted(queues - rings)[:20]}")
        stale = cluster.stale_mappings()
        if stale:
            self.find("shm-stale", f"{len(stale)} rings mapped though their name is gone or "
                                   f"another's: {stale[:10]}")
        final = dict(cluster.memory(), queues=len(queues))
        mem["max"] = {k: max(v, final[k]) for k, v in mem["max"].items()}
        warm = mem["warm"]
        if warm:
            budget = (warm["heap"] * HEAP_SLACK[0] + HEAP_SLACK[1]
                      + max(0, final["queues"] - warm["queues"]) * PER_QUEUE)
            if final["heap"] > budget:
                self.find("memory", f"server heap {warm['heap'] >> 20} MiB after warm-up "
                                    f"({warm['queues']} topics and channels), {final['heap'] >> 20} "
                                    f"MiB at the end ({final['queues']}): over {int(budget) >> 20} MiB")
        return final


def fuzz(seed, inputs, threads=8, limits=None, only=None, progress=None, timeout=10.0, names=NAMES):
    """Run `inputs` inputs of `seed` against a fresh cluster: (summary, findings)."""
    limits = limits or Limits(max_msg_size=4096, max_body_size=16384)
    with tempfile.TemporaryDirectory(prefix="nsqshm-fuzz-") as data_path:
        cluster = Cluster(data_path, limits)
        try:
            run = Run(cluster, seed, limits, timeout, names)
            summary = run.run(inputs, threads, only, progress)
        finally:
            cluster.close()
    return summary, run.findings


def report(summary, findings, limit=50):
    """The run's summary and its findings grouped by kind, each kind with up
    to `limit` examples, as text."""
    lines = [f"fuzz: {summary}", f"findings: {len(findings)}"]
    kinds = {}
    for f in findings:
        kinds.setdefault(f.kind, []).append(f)
    for kind, items in sorted(kinds.items()):
        lines.append(f"== {kind}: {len(items)}")
        lines += [str(f) for f in items[:limit]]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--inputs", type=int, default=50_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--only", type=int, default=None, help="run input number ONLY alone")
    parser.add_argument("--max-msg-size", type=int, default=4096)
    parser.add_argument("--max-body-size", type=int, default=16384)
    parser.add_argument("--skip-names", default="",
                        help="comma-separated topic/channel names to leave out (to look past a known finding)")
    args = parser.parse_args(argv)
    limits = Limits(args.max_msg_size, args.max_body_size)
    skip = {n.encode() for n in args.skip_names.split(",") if n}
    summary, findings = fuzz(args.seed, args.inputs, args.threads, limits, args.only,
                             progress=lambda s: print(s, file=sys.stderr, flush=True),
                             names=[n for n in NAMES if n not in skip])
    print(report(summary, findings, limit=10 ** 9))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
