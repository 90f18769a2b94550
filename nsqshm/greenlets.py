"""gevent for nsqshm's binaries: each worker of nsqd, nsqlookupd and nsqadmin
patches the standard library as its first act (after the fork, for nsqd)."""


def patch_all():
    """gevent.monkey.patch_all, without the plugin look-up: patch_all asks
    every installed distribution for gevent plugins (entry points) at each
    module it patches, a tenth of a second of each process's start with
    pyspark and the test extras installed.  nsqshm uses no gevent plugin."""
    import gevent.events
    from gevent import monkey

    gevent.events.notify_and_call_entry_points = gevent.events.notify
    monkey.patch_all()
