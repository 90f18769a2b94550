"""The typed errors of the coordination layer, one class per way an operation fails,
so that callers branch on the class, never on a message text."""


class CoordinationError(Exception):
    """Base of every error raised by nsqshm.consistence."""


class EtcdUnavailable(CoordinationError):
    """No etcd endpoint answered (refused, reset, timed out): the operation may or may
    not have been applied; retry it, or read back, once etcd is reachable again."""


class EtcdRequestError(CoordinationError):
    """etcd answered with a gRPC error (the gateway's {"code", "message"} body)."""

    def __init__(self, code, message, http_status):
        super().__init__(f"etcd error {code}: {message} (HTTP {http_status})")
        self.code = code
        self.message = message
        self.http_status = http_status


class LeaseNotFound(EtcdRequestError):
    """The lease is gone (expired or revoked): its keys are deleted."""


class CompareFailed(CoordinationError):
    """A compare-and-set transaction found the key changed: somebody else won."""


class InvalidName(CoordinationError, ValueError):
    """A topic name, node ID or partition that cannot become part of an etcd key."""


class TopicExists(CoordinationError):
    """create_topic: the topic's meta key already exists."""


class TopicNotFound(CoordinationError):
    """The topic (or the partition) has no meta in etcd."""


class NodeNotFound(CoordinationError):
    """`/cluster/node/remove`: the node is neither registered nor holds a replica (or,
    to call a removal off, is not being removed)."""


class NodeRemoving(CoordinationError):
    """create_topic: a node of the placement was marked for removal meanwhile."""


class LeaderAlive(CoordinationError):
    """An election was refused: the partition's leader session is still held (its
    node's lease has not expired)."""


class NotInISR(CoordinationError):
    """An election was refused: the candidate is not in the partition's ISR, so it may
    lack acknowledged messages."""


class Fenced(CompareFailed):
    """A leader's write was refused: the partition's epoch moved past the one it holds,
    or its leader session is no longer the one it created.  A deposed leader must stop
    acknowledging writes."""
