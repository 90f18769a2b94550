"""The web UI service (nsqadmin/nsqadmin.go): its options, its HTTP client
and cluster view, the notification sender and the HTTP listener, all in one
gevent process.  ``start`` does what nsqadmin.New does with the network
(resolving the nsqd/lookupd addresses, TLS client files, listening) and
raises ``StartError`` with nsqadmin's text when that fails.
"""

import socket
import ssl

from nsqshm.flags import split_host_port
from nsqshm.httpserver import HTTPServer
from nsqshm.nsqadmin.client import V1Client
from nsqshm.nsqadmin.clusterinfo import ClusterInfo
from nsqshm.nsqadmin.http_api import create_app
from nsqshm.nsqadmin.notify import Notifier
from nsqshm.nsqd.log import Logger
from nsqshm.nsqlookupd.nsqlookupd import listen_address


class StartError(Exception):
    """nsqadmin could not start; str() is the reason, as nsqadmin.New words it."""


def resolve_tcp_address(address):
    """net.ResolveTCPAddr("tcp", address): raises ValueError with Go's wording."""
    try:
        host, port = split_host_port(address)
    except ValueError as err:
        raise ValueError(f"address {address}: {err}") from None
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"address {address}: invalid port")
    if host:
        try:
            socket.getaddrinfo(host, int(port), proto=socket.IPPROTO_TCP)
        except OSError:
            raise ValueError(f"lookup {host}: no such host") from None


def client_tls_context(opts):
    """The TLS config of nsqadmin's HTTP client (--http-client-tls-*)."""
    context = ssl.create_default_context()
    if opts.http_client_tls_insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if opts.http_client_tls_cert:
        try:
            context.load_cert_chain(opts.http_client_tls_cert, opts.http_client_tls_key)
        except (OSError, ssl.SSLError) as err:
            raise StartError(f"failed to LoadX509KeyPair {opts.http_client_tls_cert}, "
                             f"{opts.http_client_tls_key} - {err}") from None
    if opts.http_client_tls_root_ca_file:
        path = opts.http_client_tls_root_ca_file
        try:
            with open(path, "rb") as fh:
                pem = fh.read().decode("ascii", "replace")
        except OSError as err:
            raise StartError(f"failed to read TLS root CA file {path} - "
                             f"open {path}: {(err.strerror or str(err)).lower()}") from None
        try:
            context.load_verify_locations(cadata=pem)
        except (ssl.SSLError, ValueError):
            raise StartError(f"failed to AppendCertsFromPEM {path}") from None
    return context


class NSQAdmin:
    def __init__(self, opts, log=None):
        self.opts = opts
        self.log = log or Logger(prefix=opts.log_prefix, level=opts.log_level)
        self.client = None
        self.ci = None
        self.notifier = Notifier(self)
        self.http_server = None

    def start(self):
        """Check the addresses, build the client, listen: the listening address."""
        opts = self.opts
        for flag, addresses in (("lookupd-http-address", opts.lookupd_http_address),
                                ("nsqd-http-address", opts.nsqd_http_address)):
            for address in addresses:
                try:
                    resolve_tcp_address(address)
                except ValueError as err:
                    raise StartError(f"failed to resolve --{flag} ({address}) - {err}") from None
        self.client = V1Client(opts.http_client_connect_timeout, opts.http_client_request_timeout,
                               client_tls_context(opts))
        self.ci = ClusterInfo(self.client, self.log)
        try:
            server = HTTPServer(listen_address(opts.http_address), create_app(self),
                                log_error=self.log.warn)
            server.init_socket()
        except (OSError, ValueError) as err:
            raise StartError(f"listen ({opts.http_address}) failed - {err}") from None
        self.http_server = server
        server.start()
        self.notifier.start()
        return server.address

    def stop(self):
        if self.http_server is not None:
            self.http_server.close()
            self.http_server.stop(timeout=1)
        self.notifier.stop()
