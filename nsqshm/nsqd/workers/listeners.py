"""The listening sockets of a broker with several workers.

Every worker accepts on the same TCP, HTTP and HTTPS ports through its own
SO_REUSEPORT socket, so the kernel spreads connections across them.  The
supervisor reserves each port first:

1. a probe bind without SO_REUSEPORT proves the port is free of anyone
   else's listener (another broker, a Go nsqd) and turns port 0 into a port;
2. a reservation socket with SO_REUSEPORT is bound there and kept, never
   listening: it holds the port while workers come and go, and receives no
   connections (only listening sockets join the kernel's reuseport group).
"""

import socket


def split_address(address):
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def _family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def join_address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def reserve(address):
    """Supervisor: (reservation socket, "host:port" with the real port)."""
    host, port = split_address(address)
    probe = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = probe.getsockname()[1]
    finally:
        probe.close()
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock, join_address(host, port)


def listen(address, backlog=1024):
    """Worker: a listening SO_REUSEPORT socket on address (a reserved port)."""
    host, port = split_address(address)
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock
