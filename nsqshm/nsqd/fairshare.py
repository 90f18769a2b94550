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
"""

import gevent


def delivered(nsqd):
    """A dispatcher round that left more to deliver."""
    nsqd.delivery_rounds += 1


def pace(nsqd):
    """Before a publish: yield to the consumers once if they ran since this
    greenlet's last publish."""
    rounds = nsqd.delivery_rounds
    me = gevent.getcurrent()
    if getattr(me, "rounds_seen", 0) != rounds:
        me.rounds_seen = rounds
        gevent.idle()
