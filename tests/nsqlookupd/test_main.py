"""`nsqshm lookupd`: the command line of a drop-in nsqlookupd 1.3 (flags as
apps/nsqlookupd/main.go, config file, version, errors, signals)."""

import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from nsqshm import __version__
from nsqshm.nsqlookupd import options as o
from tests.nsqlookupd.conftest import Lookupd


def nsqshm(*args, timeout=20):
    return subprocess.run([sys.executable, "-m", "nsqshm.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_version():
    out = nsqshm("lookupd", "--version")
    assert (out.returncode, out.stdout) == (0, f"nsqlookupd v1.3.0 (built w/nsqshm-{__version__})\n")
    assert nsqshm("lookupd", "-version").stdout == out.stdout


@pytest.mark.parametrize("args,message", [
    (["--no-such-flag=1"], "flag provided but not defined: -no-such-flag"),
    (["-tombstone-lifetime", "soon"], 'invalid value "soon" for flag -tombstone-lifetime: '
                                      "parse error"),
    (["--log-level=loud"], 'invalid value "loud" for flag -log-level: invalid log-level '
                           "'loud'"),
    (["--tcp-address"], "flag needs an argument: -tcp-address"),
])
def test_bad_flags_are_go_flags_message_then_usage_and_exit_2(args, message):
    out = nsqshm("lookupd", *args)
    assert out.returncode == 2
    assert out.stderr == message + "\n" + o.usage()


@pytest.mark.parametrize("args,message", [
    (["--http-address=127.0.0.1:99999"],
     '--http-address "127.0.0.1:99999": invalid port "99999" (must be 0-65535)'),
    (["--tcp-address=/tmp/sock"], '--tcp-address "/tmp/sock": missing port in address'),
    # the flags end at "extra": the bad address after it is never read
    (["--tcp-address=/tmp/sock", "extra", "--tcp-address=127.0.0.1:0"],
     '--tcp-address "/tmp/sock": missing port in address'),
])
def test_bad_addresses_are_one_line_and_exit_2(args, message):
    out = nsqshm("lookupd", *args)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [f"nsqlookupd: {message} (see --help)"]


def test_help():
    out = nsqshm("lookupd", "--help")
    assert out.returncode == 0
    assert out.stderr == o.usage()


def test_usage_is_go_style():
    text = o.usage()
    assert text.startswith("Usage of nsqlookupd:\n")
    names = [line.split()[0][1:] for line in text.splitlines() if line.startswith("  -")]
    assert names == sorted(["config", "version", "log-level", "log-prefix", "verbose",
                            "tcp-address", "http-address", "broadcast-address",
                            "inactive-producer-timeout", "tombstone-lifetime",
                            # youzan/nsq's, and its cluster mode
                            "allow-write-with-nochannels",
                            "cluster-id", "cluster-leadership-addresses",
                            "cluster-lease-ttl",
                            # nsqshm's: the master's replacement of lost replicas and
                            # its leadership rebalance
                            "lost-replica-wait", "lost-replica-urgent-wait",
                            "leader-rebalance-wait"])
    assert ("  -inactive-producer-timeout duration\n    \tduration of time a producer will "
            "remain in the active list since its last ping (default 5m0s)\n") in text
    assert ("  -tombstone-lifetime duration\n    \tduration of time a producer will remain "
            "tombstoned if registration remains (default 45s)\n") in text
    assert '  -tcp-address string\n    \t<addr>:<port> to listen on for TCP clients (default "0.0.0.0:4160")\n' in text
    assert "(default INFO)" in text and '(default "[nsqlookupd] ")' in text


def test_defaults():
    d = o.defaults()
    assert (d.tcp_address, d.http_address) == ("0.0.0.0:4160", "0.0.0.0:4161")
    assert d.broadcast_address == socket.gethostname()
    assert (d.inactive_producer_timeout, d.tombstone_lifetime) == (300.0, 45.0)
    assert (d.log_level, d.log_prefix, d.verbose) == ("info", "[nsqlookupd] ", False)


def test_both_flag_forms_and_config_file(tmp_path):
    path = tmp_path / "nsqlookupd.toml"
    path.write_text('log_prefix = "[lk] "\ntombstone_lifetime = "2s"\n'
                    'inactive_producer_timeout = 1500\nbogus = 1\n')
    opts = o.parse_args(["-tcp-address", "127.0.0.1:1", "--config", str(path),
                         "--tombstone-lifetime=3s"])
    assert opts.tcp_address == "127.0.0.1:1"
    assert opts.tombstone_lifetime == 3.0  # the command line wins
    assert opts.inactive_producer_timeout == 1.5  # go-options: an int is milliseconds
    assert opts.log_prefix == "[lk] "
    assert opts.warnings == [f'WARNING: config file {path}: unknown option "bogus" ignored']


def test_runs_with_a_config_file_and_exits_cleanly_on_sigint(tmp_path):
    path = tmp_path / "nsqlookupd.toml"
    path.write_text('log_prefix = "[lk] "\nhttp_address = "127.0.0.1:0"\n')
    server = Lookupd([f"--config={path}"])
    try:
        with urllib.request.urlopen(server.http + "/ping", timeout=5) as resp:
            assert resp.read() == b"OK"
        assert server.stop(signal.SIGINT) == 0
        lines = server.lines
        assert lines[0].startswith("[lk] ")
        assert f"INFO: nsqlookupd v1.3.0 (built w/nsqshm-{__version__})\n" in lines[0]
        assert any(f"INFO: TCP: listening on 127.0.0.1:{server.tcp_port}" in li for li in lines)
        assert any(f"INFO: HTTP: closing 127.0.0.1:{server.http_port}" in li for li in lines)
    finally:
        server.stop()


def test_sigterm_exits_cleanly_with_a_connected_nsqd():
    server = Lookupd()
    conn = socket.create_connection(server.tcp)
    conn.sendall(b"  V1PING\n")
    assert conn.recv(6) == b"\x00\x00\x00\x02OK"
    assert server.stop() == 0
    assert conn.recv(1) == b""


def test_listen_failure_is_fatal_exit_1():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        out = nsqshm("lookupd", f"--tcp-address=127.0.0.1:{port}", "--http-address=127.0.0.1:0")
        assert out.returncode == 1
        (line,) = [li for li in out.stderr.splitlines() if "FATAL" in li]
        assert line.startswith("[nsqlookupd] ")
        assert f"FATAL: failed to instantiate nsqlookupd - listen (127.0.0.1:{port}) failed - " in line
    finally:
        busy.close()
