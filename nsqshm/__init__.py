"""nsqshm: an NSQ broker with shared-memory queues and a Cython core."""

__version__ = "0.1.0"
NSQD_COMPAT_VERSION = "1.3.0"
