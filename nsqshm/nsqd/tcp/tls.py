"""TLS as nsqd configures it (nsqd.go buildTLSConfig, client_v2.go
UpgradeTLS, http.go): one server context from --tls-cert/--tls-key, used by
the IDENTIFY tls_v1 upgrade of TCP connections and by the HTTPS listener.

--tls-client-auth-policy:
  ""               no client certificate asked for (Go's NoClientCert)
  "require"        a client certificate is required, any certificate
                   (RequireAnyClientCert: not verified)
  "require-verify" required and verified against --tls-root-ca-file, or
                   the system's roots without it (RequireAndVerifyClientCert)
--tls-min-version sets the lowest protocol version accepted.
"""

import ctypes
import ssl
import warnings

import gevent.ssl

from nsqshm.nsqd.options import TLS_REQUIRED

HANDSHAKE_TIMEOUT = 5.0  # nsqd: tlsConn.SetDeadline(time.Now().Add(5 * time.Second))

# Go's prettyConnectionState.GetCipherSuite names, by OpenSSL name; any other
# suite is "Unknown <IANA number>" there too (TLS 1.3 suites among them)
GO_CIPHER_NAMES = {
    "RC4-SHA": "TLS_RSA_WITH_RC4_128_SHA",
    "DES-CBC3-SHA": "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "AES128-SHA": "TLS_RSA_WITH_AES_128_CBC_SHA",
    "AES256-SHA": "TLS_RSA_WITH_AES_256_CBC_SHA",
    "ECDHE-ECDSA-RC4-SHA": "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "ECDHE-ECDSA-AES128-SHA": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "ECDHE-ECDSA-AES256-SHA": "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-RC4-SHA": "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "ECDHE-RSA-DES-CBC3-SHA": "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "ECDHE-RSA-AES128-SHA": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "ECDHE-RSA-AES256-SHA": "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-AES128-GCM-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
}
TLS13_SUITES = {"TLS_AES_128_GCM_SHA256": 0x1301, "TLS_AES_256_GCM_SHA384": 0x1302,
                "TLS_CHACHA20_POLY1305_SHA256": 0x1303}
GO_VERSION_NAMES = {"TLSv1": "TLS1.0", "TLSv1.1": "TLS1.1", "TLSv1.2": "TLS1.2",
                    "TLSv1.3": "TLS1.3"}


class TLSConfigError(OSError):
    pass


def build_server_context(opts):
    """The server context, or None when neither --tls-cert nor --tls-key is
    given.  Raises TLSConfigError ("failed to build TLS config - ...")."""
    if not opts.tls_cert and not opts.tls_key:
        return None
    try:
        ctx = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
        with warnings.catch_warnings():  # TLS 1.0 and 1.1 are deprecated in Python
            warnings.simplefilter("ignore", DeprecationWarning)
            version = ssl.TLSVersion(opts.tls_min_version)
            try:
                ctx.minimum_version = version
            except ValueError:
                pass  # below what this OpenSSL offers: its own floor applies
        if opts.tls_root_ca_file:
            ctx.load_verify_locations(cafile=opts.tls_root_ca_file)
        policy = opts.tls_client_auth_policy
        if policy == "require":
            ctx.verify_mode = ssl.CERT_REQUIRED
            _accept_any_certificate(ctx)
        elif policy == "require-verify":
            if not opts.tls_root_ca_file:
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
            ctx.verify_mode = ssl.CERT_REQUIRED
        else:
            ctx.verify_mode = ssl.CERT_NONE
    except (OSError, ValueError) as err:
        raise TLSConfigError(f"failed to build TLS config - {err}") from None
    return ctx


# -- "require": a certificate, any certificate ---------------------------------------
#
# Python's ssl module cannot ask for a client certificate without verifying it,
# so the verify callback of the context's SSL_CTX is set to one that accepts
# whatever the client sent (OpenSSL still insists there is one).

_VERIFY_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_accept = _VERIFY_CALLBACK(lambda preverify_ok, store: 1)
SSL_VERIFY_PEER = 0x01
SSL_VERIFY_FAIL_IF_NO_PEER_CERT = 0x02


def _libssl():
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.rstrip("\n").split(" ")[-1]
            if "/libssl.so" in path:
                return ctypes.CDLL(path)
    raise OSError("libssl is not loaded")


def _accept_any_certificate(ctx):
    lib = _libssl()
    lib.SSL_CTX_set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, _VERIFY_CALLBACK]
    lib.SSL_CTX_set_verify.restype = None
    # CPython's PySSLContext: PyObject_HEAD, then the SSL_CTX pointer
    ssl_ctx = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    lib.SSL_CTX_set_verify(ssl_ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, _accept)


# -- what /stats shows, and the common name AUTH sends -------------------------------


def connection_state(tls_sock):
    """(cipher suite, version) named as nsqd's /stats names them."""
    cipher = tls_sock.cipher()
    name = cipher[0] if cipher else ""
    suite = GO_CIPHER_NAMES.get(name)
    if suite is None:
        number = TLS13_SUITES.get(name)
        if number is None:
            for c in tls_sock.context.get_ciphers():
                if c["name"] == name:
                    number = c["id"] & 0xFFFF
                    break
        suite = f"Unknown {number or 0}"
    version = tls_sock.version() or ""
    return suite, GO_VERSION_NAMES.get(version, version)


def peer_common_name(tls_sock):
    """The subject common name of the client's certificate ("" without one),
    read from its DER whether or not it was verified (Go's
    PeerCertificates[0].Subject.CommonName: the last CN attribute)."""
    try:
        der = tls_sock.getpeercert(binary_form=True)
    except (ValueError, OSError):
        return ""
    if not der:
        return ""
    try:
        return _subject_common_name(der)
    except (IndexError, ValueError):
        return ""


def _der(data, pos):
    """(tag, start of content, end of content) of the DER element at pos."""
    tag = data[pos]
    n = data[pos + 1]
    pos += 2
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(data[pos:pos + k], "big")
        pos += k
    if pos + n > len(data):
        raise ValueError("truncated DER")
    return tag, pos, pos + n


OID_COMMON_NAME = bytes([0x55, 0x04, 0x03])


def _subject_common_name(der):
    _, pos, _ = _der(der, 0)            # Certificate
    _, pos, end = _der(der, pos)        # tbsCertificate
    fields = []
    while pos < end:
        tag, start, stop = _der(der, pos)
        fields.append((tag, start, stop))
        pos = stop
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, subject
    _, pos, end = fields[4]
    cn = ""
    while pos < end:                    # RDNSequence: SET OF AttributeTypeAndValue
        _, set_pos, set_end = _der(der, pos)
        while set_pos < set_end:
            _, attr_pos, attr_end = _der(der, set_pos)
            _, oid_pos, oid_end = _der(der, attr_pos)
            if der[oid_pos:oid_end] == OID_COMMON_NAME:
                _, v_pos, v_end = _der(der, oid_end)
                cn = der[v_pos:v_end].decode("utf-8", "replace")
            set_pos = attr_end
        pos = set_end
    return cn


# -- the HTTPS listener ----------------------------------------------------------------


def make_https_server(nsqd, ctx):
    """The HTTPS listener on --https-address, bound but not started: the same
    app as HTTP (nsqd: newHTTPServer(n, true, true))."""
    from nsqshm.httpserver import HTTPServer
    from nsqshm.nsqd.http_api import create_app, server_log
    from nsqshm.nsqd.workers.listeners import listen

    server = HTTPServer(listen(nsqd.listen_address("https_address")), create_app(nsqd),
                        log_error=server_log(nsqd), ssl_context=ctx)
    server.init_socket()
    return server


def require_tls(app, https_port):
    """nsqd's plain HTTP server under --tls-required=true: every request is
    answered 403 with where HTTPS is."""
    body = f'{{"message": "TLS_REQUIRED", "https_port": {https_port}}}'.encode()
    headers = [("X-Nsq-Content-Type", "nsq; version=1.0"),
               ("Content-Type", "application/json; charset=utf-8"),
               ("Content-Length", str(len(body)))]

    def tls_required(environ, start_response):
        start_response("403 Forbidden", headers)
        return [body]

    tls_required.wrapped = app
    return tls_required


def install_https(nsqd):
    """Called by NSQD.start(): bind the HTTPS listener when TLS is configured
    and --https-address is not empty, and make the plain HTTP listener refuse
    requests under --tls-required=true.  Returns the HTTPS server or None."""
    ctx = nsqd.tls_context
    https = None
    if ctx is not None and nsqd.opts.https_address:
        https = make_https_server(nsqd, ctx)
    if nsqd.opts.tls_required == TLS_REQUIRED and nsqd.http_server is not None:
        port = https.address[1] if https is not None else 0
        nsqd.http_server.application = require_tls(nsqd.http_server.application, port)
    return https
