"""nsqlookupd's registration DB (nsqlookupd/registration_db.go): which nsqd
(producer) has which topic and channel.

A registration is (category, key, subkey): ("client", "", "") for every
identified nsqd, ("topic", topic, "") and ("channel", topic, channel), and
("partition", topic, "<n>") for each partition of a log topic that an nsqshm
nsqd registered (Youzan's partitioned REGISTER).  Each
maps to its producers by peer id (the nsqd connection's remote address).  A
registration may have no producers: /topic/create and /channel/create make
such ones, and producers unregistering leave them behind, as in nsqlookupd.

Go iterates its maps in random order; here everything is kept in insertion
order, which is one of the orders nsqlookupd may answer with.
"""

import time


class PeerInfo:
    """One identified nsqd connection (PeerInfo)."""

    __slots__ = ("id", "last_update", "remote_address", "hostname", "broadcast_address",
                 "tcp_port", "http_port", "version", "topic_partitions")

    def __init__(self, peer_id):
        self.id = peer_id
        self.last_update = 0  # ns since the epoch, set at IDENTIFY and every PING
        self.remote_address = ""
        self.hostname = ""
        self.broadcast_address = ""
        self.tcp_port = 0
        self.http_port = 0
        self.version = ""
        # an nsqshm nsqd that names partitions in REGISTER (lookup_protocol_v1)
        self.topic_partitions = False

    def to_json(self):
        """The JSON object nsqlookupd marshals for a PeerInfo (struct order)."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }


class Producer:
    __slots__ = ("peer_info", "tombstoned", "tombstoned_at")

    def __init__(self, peer_info):
        self.peer_info = peer_info
        self.tombstoned = False
        self.tombstoned_at = None  # time.time_ns() of the tombstone

    def __repr__(self):
        p = self.peer_info
        return f"{p.broadcast_address} [{p.tcp_port}, {p.http_port}]"

    def tombstone(self):
        self.tombstoned = True
        self.tombstoned_at = time.time_ns()

    def is_tombstoned(self, lifetime_s):
        return (self.tombstoned
                and time.time_ns() - self.tombstoned_at < int(lifetime_s * 1e9))


def is_match(reg, category, key, subkey):
    """Registration.IsMatch: "*" matches any key or subkey."""
    return (reg[0] == category and (key == "*" or reg[1] == key)
            and (subkey == "*" or reg[2] == subkey))


def keys(regs):
    return [r[1] for r in regs]


def subkeys(regs):
    return [r[2] for r in regs]


def filter_registrations(regs, category, key, subkey):
    return [r for r in regs if is_match(r, category, key, subkey)]


def filter_by_active(producers, inactivity_timeout_s, tombstone_lifetime_s):
    """Producers.FilterByActive: those pinged within the timeout and not tombstoned."""
    now = time.time_ns()
    limit = int(inactivity_timeout_s * 1e9)
    return [p for p in producers
            if not (now - p.peer_info.last_update > limit
                    or p.is_tombstoned(tombstone_lifetime_s))]


class RegistrationDB:
    def __init__(self):
        self.registrations = {}  # (category, key, subkey) -> {peer id: Producer}

    def add_registration(self, reg):
        self.registrations.setdefault(reg, {})

    def add_producer(self, reg, producer):
        """True when the producer was not registered there yet."""
        producers = self.registrations.setdefault(reg, {})
        if producer.peer_info.id in producers:
            return False
        producers[producer.peer_info.id] = producer
        return True

    def remove_producer(self, reg, peer_id):
        """(removed, producers left); the registration stays, even empty."""
        producers = self.registrations.get(reg)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        return removed, len(producers)

    def remove_registration(self, reg):
        self.registrations.pop(reg, None)

    def find_registrations(self, category, key, subkey):
        if key != "*" and subkey != "*":
            reg = (category, key, subkey)
            return [reg] if reg in self.registrations else []
        return [r for r in self.registrations if is_match(r, category, key, subkey)]

    def find_producers(self, category, key, subkey):
        if key != "*" and subkey != "*":
            return list(self.registrations.get((category, key, subkey), {}).values())
        seen = {}
        for reg, producers in self.registrations.items():
            if is_match(reg, category, key, subkey):
                for peer_id, producer in producers.items():
                    seen.setdefault(peer_id, producer)
        return list(seen.values())

    def lookup_registrations(self, peer_id):
        return [r for r, producers in self.registrations.items() if peer_id in producers]
