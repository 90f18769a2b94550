"""AUTH against an auth server started by the test: nsqd's request (GET and
POST), its reply, allowed and denied topics and channels, errors, an
expiring ttl that forces a re-auth, TLS facts (tls, common_name), several
auth servers, and pynsq and gnsq with an auth secret."""

import json
import ssl
import time

import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for
from tests.nsqd.transport import (
    AuthServer,
    Conn,
    client_context,
    run_client,
    tcp_clients,
    tls_args,
)

pytest_plugins = ["tests.nsqd.transport_fixtures"]  # certs, authd

PUB_T = {"topic": "^t$", "channels": [".*"], "permissions": ["publish"]}
SUB_T_C = {"topic": "^t$", "channels": ["^c$"], "permissions": ["subscribe"]}


@pytest.fixture
def auth_nsqd(nsqd_factory, authd):
    return nsqd_factory(f"--auth-http-address={authd.address}")


def authed(server, secret, **identify):
    c = Conn(server)
    c.identify(**identify)
    c.send(p.auth(secret.encode()))
    return c


def test_identify_reports_auth_required(auth_nsqd, nsqd):
    assert Conn(auth_nsqd).identify()["auth_required"] is True
    assert Conn(nsqd).identify()["auth_required"] is False


@pytest.mark.parametrize("command, verb", [
    (p.pub("t", b"x"), "PUB"), (p.sub("t", "c"), "SUB"), (p.dpub("t", 10, b"x"), "DPUB"),
    (b"MPUB t\n", "MPUB"),  # checked before MPUB reads its body, as nsqd
])
def test_commands_before_auth_are_refused(auth_nsqd, command, verb):
    c = Conn(auth_nsqd)
    c.send(command)
    assert c.frame() == (1, f"E_AUTH_FIRST AUTH required before {verb}".encode())
    assert c.closed()


def test_auth_request_and_reply(auth_nsqd, authd):
    authd.allow("s3cret", [PUB_T, SUB_T_C], identity="alice", identity_url="https://id/alice")
    c = authed(auth_nsqd, "s3cret")
    assert c.frame() == (0, b'{"identity":"alice","identity_url":"https://id/alice",'
                            b'"permission_count":2}')
    [req] = authd.requests
    assert req["method"] == "GET" and req["path"] == "/auth"
    assert req["query"] == {"common_name": "", "remote_ip": "127.0.0.1", "secret": "s3cret",
                            "tls": "false"}
    assert req["headers"]["Accept"] == "application/vnd.nsq; version=1.0"
    c.send(p.pub("t", b"allowed")).ok()
    c.send(p.sub("t", "c")).ok()
    client = tcp_clients(auth_nsqd)[0]
    assert (client["authed"], client["auth_identity"], client["auth_identity_url"]) == \
        (True, "alice", "https://id/alice")


@pytest.mark.parametrize("command, error", [
    (p.pub("other", b"x"), b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""'),
    (p.mpub("other", [b"x"]), b'E_UNAUTHORIZED AUTH failed for MPUB on "other" ""'),
    (p.dpub("other", 5, b"x"), b'E_UNAUTHORIZED AUTH failed for DPUB on "other" ""'),
    (p.sub("t", "d"), b'E_UNAUTHORIZED AUTH failed for SUB on "t" "d"'),
    (p.sub("other", "c"), b'E_UNAUTHORIZED AUTH failed for SUB on "other" "c"'),
])
def test_denied_topics_and_channels(auth_nsqd, authd, command, error):
    authd.allow("s", [PUB_T, SUB_T_C])
    c = authed(auth_nsqd, "s")
    c.frame()
    c.send(command)
    assert c.frame() == (1, error)
    assert c.closed()


def test_publish_permission_alone_does_not_allow_sub(auth_nsqd, authd):
    authd.allow("s", [{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}])
    c = authed(auth_nsqd, "s")
    c.frame()
    c.send(p.pub("anything", b"x")).ok()
    c.send(p.sub("anything", "c"))
    assert c.frame() == (1, b'E_UNAUTHORIZED AUTH failed for SUB on "anything" "c"')


def test_publish_needs_a_channel_regex_matching_empty(auth_nsqd, authd):
    authd.allow("s", [{"topic": "t", "channels": ["^c$"], "permissions": ["publish"]}])
    c = authed(auth_nsqd, "s")
    c.frame()
    c.send(p.pub("t", b"x"))
    assert c.frame() == (1, b'E_UNAUTHORIZED AUTH failed for PUB on "t" ""')


@pytest.mark.parametrize("answer", [
    (403, {"message": "no"}),                                  # refused
    (200, b"not json"),
    (200, {"ttl": 0, "authorizations": [PUB_T]}),               # invalid TTL 0
    (200, {"ttl": 60, "authorizations": [{"topic": "t", "channels": [".*"],
                                          "permissions": ["admin"]}]}),  # unknown permission
    (200, {"ttl": 60, "authorizations": [{"topic": "(", "channels": [],
                                          "permissions": ["publish"]}]}),  # bad regex
])
def test_auth_server_failures_are_auth_failed(auth_nsqd, authd, answer):
    authd.answers["s"] = answer
    c = authed(auth_nsqd, "s")
    assert c.frame() == (1, b"E_AUTH_FAILED AUTH failed")
    assert c.closed()
    assert wait_for(lambda: any("AUTH failed failed to auth against" in line
                                for line in auth_nsqd.lines))


def test_no_authorizations(auth_nsqd, authd):
    authd.allow("s", [])
    c = authed(auth_nsqd, "s")
    assert c.frame() == (1, b"E_UNAUTHORIZED AUTH no authorizations found")


def test_auth_twice(auth_nsqd, authd):
    authd.allow("s", [PUB_T])
    c = authed(auth_nsqd, "s")
    c.frame()
    c.send(p.auth(b"s"))
    assert c.frame() == (1, b"E_INVALID AUTH already set")


def test_auth_disabled(nsqd):
    c = Conn(nsqd).send(p.auth(b"s"))
    assert c.frame() == (1, b"E_AUTH_DISABLED AUTH disabled")


def test_auth_server_down(nsqd_factory):
    dead = AuthServer()
    dead.close()
    server = nsqd_factory(f"--auth-http-address={dead.address}")
    c = authed(server, "s")
    assert c.frame() == (1, b"E_AUTH_FAILED AUTH failed")


def test_expired_ttl_forces_a_re_auth(auth_nsqd, authd):
    authd.allow("s", [PUB_T], ttl=1)
    c = authed(auth_nsqd, "s")
    c.frame()
    c.send(p.pub("t", b"1")).ok()
    assert len(authd.requests) == 1       # cached within the ttl
    time.sleep(1.1)
    c.send(p.pub("t", b"2")).ok()         # expired: asked again, still allowed
    assert len(authd.requests) == 2
    c.send(p.pub("t", b"3")).ok()
    assert len(authd.requests) == 2
    authd.allow("s", [{"topic": "^u$", "channels": [".*"], "permissions": ["publish"]}], ttl=1)
    time.sleep(1.1)
    c.send(p.pub("t", b"4"))              # the refreshed answer no longer allows t
    assert c.frame() == (1, b'E_UNAUTHORIZED AUTH failed for PUB on "t" ""')
    assert len(authd.requests) == 3


def test_failed_refresh_is_auth_failed(auth_nsqd, authd):
    authd.allow("s", [PUB_T], ttl=1)
    c = authed(auth_nsqd, "s")
    c.frame()
    del authd.answers["s"]
    time.sleep(1.1)
    c.send(p.pub("t", b"x"))
    assert c.frame() == (1, b"E_AUTH_FAILED AUTH failed")


def test_post_request_method(nsqd_factory, authd):
    server = nsqd_factory(f"--auth-http-address={authd.address}", "--auth-http-request-method=post")
    authd.allow("s", [PUB_T])
    c = authed(server, "s")
    assert c.frame()[0] == 0
    [req] = authd.requests
    assert req["method"] == "POST" and req["path"] == "/auth"
    assert req["headers"]["Content-Type"] == "application/json"
    assert json.loads(req["body"]) == {"common_name": [""], "remote_ip": ["127.0.0.1"],
                                       "secret": ["s"], "tls": ["false"]}


def test_full_url_and_several_servers(nsqd_factory, authd):
    dead = AuthServer()
    dead.close()
    server = nsqd_factory(f"--auth-http-address=http://{authd.address}/custom/path",
                          f"--auth-http-address={dead.address}")
    authd.allow("s", [PUB_T])
    for _ in range(4):  # whichever server is tried first, the live one answers
        c = authed(server, "s")
        assert c.frame()[0] == 0
        c.close()
    assert {r["path"] for r in authd.requests} == {"/custom/path"}


def test_bad_request_method_is_refused(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "nsqshm.cli", "start",
                          "--auth-http-request-method=put"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2
    assert "--auth-http-request-method must be post or get" in out.stderr


def test_http_publishing_is_not_subject_to_auth(auth_nsqd):
    """nsqd applies AUTH to the TCP protocol only (http.go has no CheckAuth)."""
    assert auth_nsqd.post("/pub?topic=t", b"x") == (200, b"OK")


def test_tls_facts_reach_the_auth_server(nsqd_factory, certs, authd):
    server = nsqd_factory(*tls_args(certs, f"--auth-http-address={authd.address}",
                                    "--tls-client-auth-policy=require-verify",
                                    f"--tls-root-ca-file={certs['ca']}.pem"))
    authd.allow("s", [PUB_T])
    c = Conn(server)
    assert c.identify(tls_v1=True)["auth_required"] is True
    c.start_tls(client_context(certs, cert="client")).ok()
    c.send(p.auth(b"s"))
    assert c.frame()[0] == 0
    assert authd.requests[0]["query"] == {"common_name": "client-ok", "remote_ip": "127.0.0.1",
                                          "secret": "s", "tls": "true"}
    c.send(p.pub("t", b"x")).ok()


def test_https_auth_server_with_root_ca(nsqd_factory, certs):
    """--tls-root-ca-file is trusted for an https auth server (nsqd 1.3 #1473)."""
    authd = AuthServer()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs["server"] + ".pem", certs["server"] + ".key")
    authd.httpd.socket = ctx.wrap_socket(authd.httpd.socket, server_side=True)
    try:
        server = nsqd_factory(f"--auth-http-address=https://127.0.0.1:"
                              f"{authd.httpd.server_address[1]}/auth",
                              f"--tls-root-ca-file={certs['ca']}.pem")
        authd.allow("s", [PUB_T])
        c = authed(server, "s")
        assert c.frame()[0] == 0
    finally:
        authd.close()


# -- real clients ----------------------------------------------------------------------


@pytest.mark.parametrize("library", ["pynsq", "gnsq"])
def test_clients_with_auth_secret(nsqd_factory, authd, library):
    server = nsqd_factory(f"--auth-http-address={authd.address}")
    topic = f"{library}-auth"
    authd.allow("good", [{"topic": topic, "channels": [".*"],
                          "permissions": ["publish", "subscribe"]}])
    r = run_client(library, "basic", server, topic, opts={"auth_secret": "good"})
    assert r["errors"] == [] and r["published"] == 20
    assert sorted(b for _, b, _ in r["received"]) == sorted(f"m{i}" for i in range(20))
    assert {q["query"]["secret"] for q in authd.requests} == {"good"}
