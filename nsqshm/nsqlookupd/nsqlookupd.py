"""The discovery service (nsqlookupd/nsqlookupd.go): a registration DB fed
by nsqd over TCP (lookup_protocol_v1) and read over HTTP (http_api).
Everything runs in gevent greenlets of one process."""

import socket

from gevent.server import StreamServer

from nsqshm import NSQD_COMPAT_VERSION
from nsqshm.consistence.lookupd_coordinator import LookupdCoordinator
from nsqshm.consistence.options import cluster_mode
from nsqshm.flags import split_host_port
from nsqshm.nsqd.log import Logger
from nsqshm.nsqlookupd.lookup_protocol_v1 import LookupProtocolV1
from nsqshm.nsqlookupd.registration_db import RegistrationDB


def listen_address(address):
    """host:port -> (host, port) for a listener; "" listens on every interface
    on a free port, as Go's net.Listen("tcp", "")."""
    if not address:
        return ("0.0.0.0", 0)
    host, port = split_host_port(address)
    return (host or "0.0.0.0", int(port or 0))


class NSQLookupd:
    def __init__(self, opts, log=None):
        self.opts = opts
        self.log = log or Logger(prefix=opts.log_prefix, level=opts.log_level)
        self.db = RegistrationDB()
        self.hostname = socket.gethostname()
        self.clients = {}  # remote address -> ClientV1
        self.tcp_server = None
        self.http_server = None
        self.exiting = False
        self.coordinator = None  # cluster mode: a LookupdCoordinator

    @property
    def tcp_port(self):
        return self.tcp_server.address[1]

    @property
    def http_port(self):
        return self.http_server.address[1]

    def start(self):
        """Bind and start both listeners; returns (tcp address, http address).
        Raises OSError with nsqlookupd.New's text when one cannot listen."""
        from nsqshm.nsqlookupd.http_api import make_http_server

        self.protocol = LookupProtocolV1(self)
        for name in ("tcp_address", "http_address"):
            address = getattr(self.opts, name)
            try:
                listen = listen_address(address)
                if name == "tcp_address":
                    server = StreamServer(listen, self.protocol.handle, backlog=1024)
                    server.init_socket()
                    self.tcp_server = server
                else:
                    self.http_server = make_http_server(self, listen)
            except (OSError, ValueError) as err:
                self.stop()
                raise OSError(f"listen ({address}) failed - {err}") from None
        self.tcp_server.start()
        self.http_server.start()
        if cluster_mode(self.opts):  # etcd: topics, partitions, leaders (consistence/)
            self.coordinator = LookupdCoordinator(self.opts, self._logf, self.tcp_port,
                                                  self.http_port, NSQD_COMPAT_VERSION).start()
        return self.tcp_server.address, self.http_server.address

    def _logf(self, level, msg):
        getattr(self.log, level)(msg)

    def stop(self):
        """Stop listening and close every nsqd connection (Exit)."""
        if self.exiting:
            return
        self.exiting = True
        if self.coordinator is not None:
            self.coordinator.close()
        servers = [s for s in (self.tcp_server, self.http_server) if s is not None]
        for server in servers:
            server.close()  # no new connections
        for client in list(self.clients.values()):
            try:
                client.sock.close()
            except OSError:
                pass
        for server in servers:
            server.stop(timeout=1)
