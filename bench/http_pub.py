"""HTTP /pub over keep-alive, outside the suites: `python bench/http_pub.py [TREE] [CONNS]
[SECONDS]` starts `nsqshm start --workers=2` from the source tree TREE (default: this one),
runs CONNS client processes (default 1), each sending POST /pub (100-byte body) one after
another on one keep-alive connection for SECONDS (default 10), and prints requests per second
and the server's CPU time per request (user + system of the supervisor and its workers, which
a loaded machine disturbs less than the rate).  Give an older tree to compare servers."""

import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import psutil

BODY = b"x" * 100
REQUEST = (b"POST /pub?topic=bench HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n"
           % len(BODY)) + BODY


def client(port, seconds, results):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    count = 0
    buf = b""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(REQUEST)
        while True:  # one whole response: head, then Content-Length bytes
            head_end = buf.find(b"\r\n\r\n")
            if head_end >= 0:
                length = int(re.search(rb"(?i)content-length: (\d+)", buf[:head_end]).group(1))
                total = head_end + 4 + length
                if len(buf) >= total:
                    if not buf.startswith(b"HTTP/1.1 200"):
                        raise SystemExit(f"unexpected answer: {buf[:100]!r}")
                    buf = buf[total:]
                    break
            chunk = sock.recv(65536)
            if not chunk:
                raise SystemExit("the server closed the connection")
            buf += chunk
        count += 1
    results.put(count)


def main():
    tree = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    conns = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    data = tempfile.mkdtemp(prefix="nsqshm-http-bench-")
    prefix = f"nsqshm-bench-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsqshm.cli", "start", "--workers=2", "--tcp-address=127.0.0.1:0",
         "--http-address=127.0.0.1:0", f"--data-path={data}", f"--shm-prefix={prefix}"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": tree}, cwd=tree)
    try:
        port = None
        for line in proc.stderr:
            m = re.search(r"HTTP: listening on \S+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            raise SystemExit("nsqshm start did not come up")
        threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
        time.sleep(1)  # every worker listening
        server = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]

        def cpu():
            return sum(sum(p.cpu_times()[:2]) for p in server)

        cpu_before = cpu()
        results = multiprocessing.Queue()
        clients = [multiprocessing.Process(target=client, args=(port, seconds, results))
                   for _ in range(conns)]
        for c in clients:
            c.start()
        total = sum(results.get() for _ in clients)
        for c in clients:
            c.join()
        used = cpu() - cpu_before
        print(f"{tree}: {conns} connection(s), {seconds:g} s: {total} requests, "
              f"{total / seconds:.0f} req/s, server CPU {used:.1f} s = "
              f"{used / max(total, 1) * 1e6:.0f} us/request")
    finally:
        proc.terminate()
        proc.wait(10)
        for entry in os.listdir("/dev/shm"):
            if entry.startswith(prefix):
                os.unlink(f"/dev/shm/{entry}")
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
