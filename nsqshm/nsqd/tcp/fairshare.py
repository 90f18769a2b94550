"""The fair share between a worker's publishers and its consumers.

Each connection is a greenlet, and gevent's hub runs the ready ones in turn,
a turn being whatever a greenlet does before it waits.  A dispatcher yields
after every round of deliveries (gevent.idle); a publisher flat out keeps
finding bytes in its socket and seldom waits, and the pump then moves what
it published into the channels (past --mem-queue-size, to disk).  Left so,
publishing takes most of the worker, and with the pump's work most of the
CPU the consumers' own processes need (bench/notes/clients.md: consumers
got 0.37 of their rate alone, some runs nothing).

So each dispatcher round with more to deliver counts in the worker's
`delivery_rounds`, and a publisher (a TCP connection's greenlet, or an HTTP
connection's) whose worker has delivered since its last publish waits for
the hub to go idle once before publishing: the consumers' reads (FINs) and
writes run, and each dispatcher gets a round, between two publishing
commands.  With no delivery going on a publisher never waits.

A consumer's reads are batched (--consumer-read-delay: the reader waits for
8 KiB of FINs or the delay) only while its worker publishes nothing (none in
the last RECENT seconds, as the reader sees it before each wait): a
batched consumer's dispatcher runs a round per batch, so publishers flat out
would see few rounds, seldom yield, and take the worker (consumers got 0.35
of their rate alone in bench/notes/clients.md's run of the first build).
"""

import time

import gevent

RECENT = 0.1  # a worker that published this recently counts as publishing


def delivered(nsqd):
    """A dispatcher round that left more to deliver."""
    nsqd.delivery_rounds += 1


def publishing(nsqd):
    """Whether the worker served a publish in the last RECENT seconds."""
    return time.monotonic() - nsqd.last_publish < RECENT


def pace(nsqd):
    """Before a publish: yield to the consumers once if they ran since this
    greenlet's last publish."""
    nsqd.last_publish = time.monotonic()
    rounds = nsqd.delivery_rounds
    me = gevent.getcurrent()
    if getattr(me, "rounds_seen", 0) != rounds:
        me.rounds_seen = rounds
        gevent.idle()
