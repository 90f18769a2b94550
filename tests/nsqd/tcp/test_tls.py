"""TLS: the IDENTIFY tls_v1 upgrade byte by byte, --tls-required,
--tls-client-auth-policy, --tls-min-version, the HTTPS listener, and pynsq
and gnsq over TLS (alone, with snappy, with deflate)."""

import json
import ssl
import subprocess
import sys
import urllib.request

import pytest

from nsqshm import protocol as p
from tests.nsqd.transport import (
    Conn,
    client_context,
    https_port,
    run_client,
    tcp_clients,
    tls_args,
)

pytest_plugins = ["tests.nsqd.transport_fixtures"]  # certs, authd

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)

IDENTIFY_TLS_REPLY = (b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,'
                      b'"msg_timeout":60000,"tls_v1":true,"deflate":false,"deflate_level":6,'
                      b'"max_deflate_level":6,"snappy":false,"sample_rate":0,'
                      b'"auth_required":false,"output_buffer_size":16384,'
                      b'"output_buffer_timeout":250}')


@pytest.fixture
def tls_nsqd(nsqd_factory, certs):
    return nsqd_factory(*tls_args(certs))


def test_identify_tls_sequence_bytes(tls_nsqd, certs):
    """nsqd's order: the JSON reply in the clear, the handshake, then OK over TLS."""
    c = Conn(tls_nsqd)
    c.send(p.identify({"feature_negotiation": True, "tls_v1": True}))
    reply = b""
    while len(reply) < 8 + len(IDENTIFY_TLS_REPLY):
        reply += c.raw.recv(4096)
    assert reply == (len(IDENTIFY_TLS_REPLY) + 4).to_bytes(4, "big") + b"\0\0\0\0" \
        + IDENTIFY_TLS_REPLY
    c.start_tls(client_context(certs))
    ok = c.sock.recv(100)
    assert ok == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    c.send(p.pub("tls", b"over tls")).ok()
    c.send(p.sub("tls", "c")).ok()
    c.send(p.rdy(1))
    assert c.messages(1)[0].body == b"over tls"
    client = next(x for x in tcp_clients(tls_nsqd) if x["ready_count"] == 1)
    assert client["tls"] is True
    assert client["tls_version"] == "TLS1.3"
    assert client["tls_cipher_suite"].startswith("Unknown 48")  # TLS 1.3 suites: Go has no name
    c.close()


def test_tls_1_2_cipher_named_as_go(tls_nsqd, certs):
    c = Conn(tls_nsqd)
    assert c.identify(tls_v1=True)["tls_v1"] is True
    c.start_tls(client_context(certs, maximum=ssl.TLSVersion.TLSv1_2)).ok()
    c.send(p.sub("t12", "c")).ok()
    client = tcp_clients(tls_nsqd)[0]
    assert client["tls_version"] == "TLS1.2"
    assert client["tls_cipher_suite"] == "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" or \
        client["tls_cipher_suite"].startswith("Unknown ")
    c.close()


def test_tls_not_configured_is_reported_off(nsqd):
    c = Conn(nsqd)
    reply = c.identify(tls_v1=True)
    assert reply["tls_v1"] is False
    c.send(p.pub("plain", b"x")).ok()  # no upgrade happened
    c.close()


def test_tls_not_asked_for_stays_plain(tls_nsqd):
    c = Conn(tls_nsqd)
    assert c.identify()["tls_v1"] is False
    c.send(p.pub("plain", b"x")).ok()
    c.close()


def test_failed_handshake_closes_the_connection(tls_nsqd):
    c = Conn(tls_nsqd)
    assert c.identify(tls_v1=True)["tls_v1"] is True
    c.raw.sendall(b"this is not a TLS ClientHello\n" * 4)
    assert c.closed()


# -- --tls-required ------------------------------------------------------------------


@pytest.mark.parametrize("command, verb", [
    (p.pub("t", b"x"), "PUB"), (p.sub("t", "c"), "SUB"), (p.nop(), "NOP"),
    (b"FOO\n", "FOO"), (p.auth(b"s"), "AUTH"),
])
def test_tls_required_refuses_plain_commands(nsqd_factory, certs, command, verb):
    server = nsqd_factory(*tls_args(certs, "--tls-required=true"))
    c = Conn(server)
    c.send(command)
    assert c.frame() == (p.FRAME_TYPE_ERROR,
                         f"E_INVALID cannot {verb} in current state (TLS required)".encode())
    assert c.closed()


@pytest.mark.parametrize("mode", ["true", "tcp-https"])
def test_tls_required_allows_identify_then_tls(nsqd_factory, certs, mode):
    server = nsqd_factory(*tls_args(certs, f"--tls-required={mode}"))
    c = Conn(server)
    assert c.identify(tls_v1=True)["tls_v1"] is True
    c.start_tls(client_context(certs)).ok()
    c.send(p.pub("t", b"x")).ok()
    c.close()


def test_tls_required_true_refuses_plain_http(nsqd_factory, certs):
    server = nsqd_factory(*tls_args(certs, "--tls-required=true"))
    port = https_port(server)
    try:
        urllib.request.urlopen(server.url("/ping"), timeout=10)
        raise AssertionError("plain HTTP answered")
    except urllib.error.HTTPError as err:
        assert err.code == 403
        assert err.read() == f'{{"message": "TLS_REQUIRED", "https_port": {port}}}'.encode()
        assert err.headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    ctx = client_context(certs)
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/ping", timeout=10,
                                context=ctx) as resp:
        assert resp.read() == b"OK"


def test_tls_required_tcp_https_keeps_plain_http(nsqd_factory, certs):
    server = nsqd_factory(*tls_args(certs, "--tls-required=tcp-https"))
    assert server.get("/ping") == (200, b"OK")


# -- HTTPS ---------------------------------------------------------------------------


def test_https_pub_mpub_and_stats(tls_nsqd, certs):
    base = f"https://127.0.0.1:{https_port(tls_nsqd)}"  # waits for the log line
    assert any("INFO: HTTPS: listening on 127.0.0.1:" in line for line in tls_nsqd.lines)
    ctx = client_context(certs)

    def post(path, body):
        req = urllib.request.Request(base + path, data=body, method="POST")
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, resp.read()

    assert post("/pub?topic=secure", b"one") == (200, b"OK")
    assert post("/mpub?topic=secure", b"two\nthree\n") == (200, b"OK")
    with urllib.request.urlopen(base + "/stats?format=json", timeout=10, context=ctx) as resp:
        topics = json.loads(resp.read())["topics"]
    assert [(t["topic_name"], t["message_count"]) for t in topics] == [("secure", 3)]
    c = Conn(tls_nsqd).send(p.identify({}))
    c.ok()
    c.send(p.sub("secure", "c")).ok()
    c.send(p.rdy(10))
    assert [m.body for m in c.messages(3)] == [b"one", b"two", b"three"]


def test_no_https_listener_without_tls(nsqd):
    assert not any("HTTPS" in line for line in nsqd.lines)


def test_bad_certificate_path_fails_at_start(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nsqshm.cli", "start", "--tcp-address=127.0.0.1:0",
                          "--http-address=127.0.0.1:0", f"--data-path={tmp_path}",
                          f"--tls-cert={tmp_path}/nope.pem", f"--tls-key={tmp_path}/nope.key"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "failed to build TLS config - " in out.stderr


# -- client certificates and versions ------------------------------------------------


def handshake(server, ctx):
    """IDENTIFY tls_v1 and the handshake; True when the server said OK over TLS."""
    c = Conn(server)
    assert c.identify(tls_v1=True)["tls_v1"] is True
    try:
        c.start_tls(ctx)
        c.ok()
        c.send(p.pub("t", b"x")).ok()
        return True
    except (ssl.SSLError, ConnectionError, OSError):
        return False
    finally:
        c.close()


def test_client_auth_policy_require_verify(nsqd_factory, certs):
    server = nsqd_factory(*tls_args(certs, "--tls-client-auth-policy=require-verify",
                                    f"--tls-root-ca-file={certs['ca']}.pem"))
    assert handshake(server, client_context(certs, cert="client"))
    assert not handshake(server, client_context(certs))             # no certificate
    assert not handshake(server, client_context(certs, cert="stranger"))  # not the CA's
    # a client policy implies --tls-required (nsqd): plain commands are refused
    c = Conn(server).send(p.pub("t", b"x"))
    assert c.frame()[1] == b"E_INVALID cannot PUB in current state (TLS required)"


def test_client_auth_policy_require_takes_any_certificate(nsqd_factory, certs):
    server = nsqd_factory(*tls_args(certs, "--tls-client-auth-policy=require"))
    assert handshake(server, client_context(certs, cert="stranger"))
    assert handshake(server, client_context(certs, cert="client"))
    assert not handshake(server, client_context(certs))


def test_tls_min_version(nsqd_factory, certs):
    server = nsqd_factory(*tls_args(certs, "--tls-min-version=tls1.3"))
    assert not handshake(server, client_context(certs, maximum=ssl.TLSVersion.TLSv1_2))
    assert handshake(server, client_context(certs))


# -- real clients ----------------------------------------------------------------------


def library_tls_options(library, certs):
    if library == "pynsq":  # tornado ssl_options
        return {"ca_certs": certs["ca"] + ".pem", "cert_reqs": int(ssl.CERT_REQUIRED)}
    return {"ca_certs": certs["ca"] + ".pem", "cert_reqs": int(ssl.CERT_REQUIRED)}


@pytest.mark.parametrize("library", ["pynsq", "gnsq"])
@pytest.mark.parametrize("extra", [{}, {"snappy": True}, {"deflate": True, "deflate_level": 1}],
                         ids=["tls", "tls+snappy", "tls+deflate"])
def test_clients_over_tls(tls_nsqd, certs, library, extra):
    opts = {"tls_v1": True, "tls_options": library_tls_options(library, certs), **extra}
    r = run_client(library, "basic", tls_nsqd, f"{library}-tls", opts=opts)
    assert r["errors"] == [] and r["published"] == 20
    assert sorted(b for _, b, _ in r["received"]) == sorted(f"m{i}" for i in range(20))
    log = "".join(tls_nsqd.lines)
    assert "upgrading connection to TLS" in log
    if extra.get("snappy"):
        assert "upgrading connection to snappy" in log
    if extra.get("deflate"):
        assert "upgrading connection to deflate (level 1)" in log
