"""gnsq (gevent) scenarios against an nsqd, run as a subprocess by the tests:

    python gnsq_client.py SCENARIO HOST:PORT TOPIC [N]

prints one JSON object with what happened.  NSQ_CLIENT_OPTS (JSON), when
set, is passed to every Consumer and Producer (tls_v1, tls_options, snappy,
deflate, deflate_level, auth_secret, sample_rate, ...)."""

import gevent.monkey

gevent.monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
import gnsq  # noqa: E402

scenario, address, topic = sys.argv[1:4]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 20
result = {"published": 0, "received": [], "attempts": {}, "errors": []}
bodies = [f"m{i}".encode() for i in range(n)]
t0 = time.monotonic()
finished = gevent.event.Event()
client_opts = json.loads(os.environ.get("NSQ_CLIENT_OPTS", "{}"))
if "auth_secret" in client_opts:  # gnsq sends it as a body: bytes
    client_opts["auth_secret"] = client_opts["auth_secret"].encode()
# gnsq 1.0.2's Producer cannot upgrade a connection: the OK frames nsqd sends
# after TLS/snappy/deflate reach its response handler before it keeps a queue
# for the connection (KeyError), against any nsqd; so it publishes without them
producer_opts = {k: v for k, v in client_opts.items()
                 if k not in ("tls_v1", "tls_options", "snappy", "deflate", "deflate_level")}


def record(message, channel="c"):
    body = message.body.decode()
    result["received"].append([channel, body, message.attempts])
    result["attempts"][body] = max(result["attempts"].get(body, 0), message.attempts)


def consumer(channel, handler, **kw):
    c = gnsq.Consumer(topic, channel, nsqd_tcp_addresses=[address],
                      max_in_flight=kw.pop("max_in_flight", 50), **client_opts, **kw)
    c.on_message.connect(handler, weak=False)
    gevent.spawn(c.start)
    return c


def publish(mode="pub"):
    producer = gnsq.Producer([address], **producer_opts)
    producer.start()
    try:
        if mode == "mpub":
            producer.multipublish(topic, bodies)
            result["published"] += n
        else:
            for b in bodies:
                if mode == "dpub":
                    producer.publish(topic, b, defer=500)
                else:
                    producer.publish(topic, b)
                result["published"] += 1
    except gnsq.errors.NSQException as err:
        result["errors"].append(repr(err))
    producer.close()


consumers = []

if scenario in ("basic", "mpub"):
    def handler(c, message):
        record(message)
        if len(result["received"]) >= n:
            finished.set()
    consumers.append(consumer("c", handler))
    publish("mpub" if scenario == "mpub" else "pub")

elif scenario == "requeue":
    def handler(c, message):
        record(message)
        if message.attempts == 1:
            message.requeue(0, backoff=False)
            return
        message.finish()
        if sum(1 for r in result["received"] if r[2] == 2) >= n:
            finished.set()
    consumers.append(consumer("c", handler, max_tries=None))
    publish()

elif scenario == "timeout":
    def handler(c, message):
        record(message)
        if message.attempts == 1:
            message.enable_async()  # never answered: nsqd must time it out
            return
        if sum(1 for r in result["received"] if r[2] == 2) >= n:
            finished.set()
    consumers.append(consumer("c", handler, max_tries=None))  # the server runs with --msg-timeout=1s
    publish()

elif scenario == "dpub":
    def handler(c, message):
        record(message)
        result.setdefault("delays", []).append(time.monotonic() - t0)
        if len(result["received"]) >= n:
            finished.set()
    consumers.append(consumer("c", handler))
    publish("dpub")

elif scenario == "touch":
    def handler(c, message):
        record(message)
        message.enable_async()

        def work():
            for _ in range(4):
                gevent.sleep(0.4)
                message.touch()
            gevent.sleep(0.4)
            message.finish()
        gevent.spawn(work)
    consumers.append(consumer("c", handler, max_tries=None))  # the server runs with --msg-timeout=1s
    publish()
    gevent.sleep(3.5)
    finished.set()

elif scenario == "shared":
    def make(name):
        def handler(c, message):
            record(message, name)
            if len(result["received"]) >= n:
                finished.set()
        return handler
    for k in range(3):
        consumers.append(consumer("c", make(f"r{k}"), max_in_flight=5))
    gevent.sleep(1.0)  # all three subscribed before the first message
    publish()

elif scenario == "sampled":  # all n in one MPUB; whatever comes in 3 s (sample_rate in opts)
    def handler(c, message):
        record(message)
    consumers.append(consumer("c", handler))
    publish("mpub")
    gevent.sleep(3)
    finished.set()

elif scenario == "requeue_always":  # the server dead-letters at 3 attempts (test_policy.py)
    def handler(c, message):
        record(message)
        message.requeue(0, backoff=False)
        if len(result["received"]) >= 3 * n:
            gevent.spawn_later(1.0, finished.set)  # (a 4th delivery would show by then)
    consumers.append(consumer("c", handler, max_tries=None))
    publish()

else:
    raise SystemExit(f"unknown scenario {scenario}")

finished.wait(25)
gevent.sleep(0.3)
for c in consumers:
    c.close()
result["elapsed"] = time.monotonic() - t0
print(json.dumps(result))
