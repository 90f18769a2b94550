"""The nsqd command line: a drop-in for the nsqd binary."""

import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request

from nsqshm import __version__
from nsqshm.nsqd.options import usage


def nsqshm(*args, timeout=20):
    return subprocess.run([sys.executable, "-m", "nsqshm.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_version():
    out = nsqshm("start", "--version")
    assert out.returncode == 0
    assert out.stdout == f"nsqd v1.3.0 (built w/nsqshm-{__version__})\n"


def test_bad_flag_is_go_flags_message_then_usage_and_exit_2():
    out = nsqshm("start", "--no-such-flag=1")
    assert out.returncode == 2
    assert out.stderr == "flag provided but not defined: -no-such-flag\n" + usage()


def test_bad_value_is_go_flags_message_then_usage():
    out = nsqshm("start", "-max-rdy-count", "lots")
    assert out.returncode == 2
    assert out.stderr == 'invalid value "lots" for flag -max-rdy-count: parse error\n' + usage()


def test_bad_option_value_is_one_line():
    out = nsqshm("start", "--max-deflate-level=10")
    assert (out.returncode, out.stderr) == (2, "nsqd: --max-deflate-level must be [1,9] (see --help)\n")


def test_no_effect_flags_are_said_at_start_one_line_each(nsqd_factory):
    server = nsqd_factory("--worker-id", "--queue-scan-interval=1s",
                          "--queue-scan-selection-count=5")
    said = [line for line in server.lines if "is accepted but has no effect" in line]
    assert len(said) == 3
    assert "WARNING: flag -worker-id is accepted but has no effect: deprecated in nsqd" in said[0]
    assert "-queue-scan-selection-count" in said[1] and "-queue-scan-interval" in said[2]
    assert all("sleeps until the earliest deadline" in line for line in said[1:])


def identify(server, **features):
    """A raw V2 IDENTIFY on a fresh socket: nsqd's JSON reply."""
    body = json.dumps({"feature_negotiation": True, **features}).encode()
    with socket.create_connection(server.tcp, timeout=10) as sock:
        sock.sendall(b"  V2" + b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
        head = b""
        while len(head) < 8:
            head += sock.recv(8 - len(head))
        size, frame_type = struct.unpack(">II", head)
        data = b""
        while len(data) < size - 4:
            data += sock.recv(size - 4 - len(data))
    assert frame_type == 0, data
    return json.loads(data)


def test_node_client_argv_starts_and_serves_deflate(nsqd_factory, tmp_path):
    """A Node.js client's suite runs `nsqd ... -deflate true`: Go nsqd sets
    deflate and ignores "true"; so does nsqshm (the config file's false loses
    to the flag)."""
    config = tmp_path / "nsqd.toml"
    config.write_text("deflate = false\n")
    server = nsqd_factory(f"--config={config}", "-deflate", "true")
    assert identify(server, deflate=True)["deflate"] is True
    assert any('arguments after the flags are ignored, as nsqd ignores them: "true"' in line
               for line in server.lines)


def test_config_file_false_deflate_refuses_deflate(nsqd_factory, tmp_path):
    config = tmp_path / "nsqd.toml"
    config.write_text("deflate = false\n")
    server = nsqd_factory(f"--config={config}")
    assert identify(server, deflate=True)["deflate"] is False


def test_ping_answers_once_listening(tmp_path):
    # Start-up time is a benchmark's business (a loaded CI machine took 2.3 s); what is tested here
    # is that /ping answers OK at once when the log says HTTP is listening, with no warm-up window.
    prefix = f"nsqshm-test-ping-{os.getpid()}"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "nsqshm.cli", "start",
                             "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                             f"--data-path={tmp_path}", f"--shm-prefix={prefix}"],
                            stderr=subprocess.PIPE, text=True)
    try:
        port = None
        seen = []
        while port is None:
            line = proc.stderr.readline()
            assert line, "the broker exited before listening:\n" + "".join(seen)
            seen.append(line)
            if "HTTP: listening on" in line:
                port = int(line.rsplit(":", 1)[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5) as resp:
            assert resp.read() == b"OK"
        assert time.monotonic() - t0 < 30  # a hang, not a slow machine
    finally:
        proc.terminate()
        assert proc.wait(10) == 0  # SIGTERM: clean exit
        subprocess.run(f"rm -f /dev/shm/{prefix}*", shell=True)


def test_sigint_exits_cleanly(nsqd):
    import signal

    assert nsqd.stop(signal.SIGINT) == 0
    assert any("NSQ: bye" in line for line in nsqd.lines)


def test_no_http_listener_when_http_address_is_empty(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "nsqshm.cli", "start",
                             "--tcp-address=127.0.0.1:0", "--http-address=",
                             f"--data-path={tmp_path}", "--shm-prefix=nsqshm-test-nohttp"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        while "TCP: listening" not in line:
            line = proc.stderr.readline()
        time.sleep(0.3)
        assert proc.poll() is None
    finally:
        proc.terminate()
        rest = proc.stderr.read()
        assert proc.wait(10) == 0
        assert "HTTP: listening" not in rest
        subprocess.run("rm -f /dev/shm/nsqshm-test-nohttp*", shell=True)
