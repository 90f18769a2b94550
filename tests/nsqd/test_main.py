"""The nsqd command line: a drop-in for the nsqd binary."""

import os
import subprocess
import sys
import time
import urllib.request

from nsqshm import __version__


def nsqshm(*args, timeout=20):
    return subprocess.run([sys.executable, "-m", "nsqshm.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_version():
    out = nsqshm("start", "--version")
    assert out.returncode == 0
    assert out.stdout == f"nsqd v1.3.0 (built w/nsqshm-{__version__})\n"


def test_bad_flag_is_one_line_and_exit_2():
    out = nsqshm("start", "--no-such-flag=1")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "nsqd: flag provided but not defined: -no-such-flag (see --help)"]


def test_bad_value_is_one_line():
    out = nsqshm("start", "-max-rdy-count", "lots")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert 'invalid value "lots" for flag -max-rdy-count' in out.stderr


def test_unimplemented_flag_is_accepted_with_a_warning(nsqd_factory):
    server = nsqd_factory("--worker-id")
    assert any("WARNING: flag -worker-id is accepted but not implemented yet" in line
               for line in server.lines)


def test_ping_within_a_second_of_launch(tmp_path):
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
        assert time.monotonic() - t0 < 1.0 + 0.5  # interpreter start-up included
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
