"""Cooperative polling for the tests: the sessions' greenlets run while a test waits."""

import time

import gevent


def wait_for(predicate, timeout, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        gevent.sleep(step)
    return predicate()
