"""pynsq (tornado) scenarios against an nsqd, run as a subprocess by the tests:

    python pynsq_client.py SCENARIO HOST:PORT TOPIC [N]

prints one JSON object with what happened.  NSQ_CLIENT_OPTS (JSON), when
set, is passed to every Reader and Writer (tls_v1, tls_options, snappy,
deflate, deflate_level, auth_secret, sample_rate, ...)."""

import json
import os
import sys
import time

import nsq
import tornado.ioloop

scenario, address, topic = sys.argv[1:4]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 20
loop = tornado.ioloop.IOLoop.current()
result = {"published": 0, "received": [], "attempts": {}, "errors": []}
readers = []
client_opts = json.loads(os.environ.get("NSQ_CLIENT_OPTS", "{}"))


def done():
    for r in readers:
        r.close()
    loop.add_callback(loop.stop)


def pub_all(writer, bodies, mode="pub"):
    def cb(conn, data):
        if isinstance(data, nsq.Error):
            result["errors"].append(str(data))
        else:
            result["published"] += 1 if mode != "mpub" else len(bodies)

    def go():
        if not writer.conns:
            loop.call_later(0.05, go)
            return
        if mode == "mpub":
            writer.mpub(topic, bodies, callback=cb)
        elif mode == "dpub":
            for b in bodies:
                writer.dpub(topic, 500, b, callback=cb)
        else:
            for b in bodies:
                writer.pub(topic, b, callback=cb)

    loop.call_later(0.05, go)


def record(message, channel="c"):
    body = message.body.decode()
    result["received"].append([channel, body, message.attempts])
    result["attempts"][body] = max(result["attempts"].get(body, 0), message.attempts)


def reader(channel, handler, **kw):
    r = nsq.Reader(topic=topic, channel=channel, message_handler=handler,
                   nsqd_tcp_addresses=[address], max_in_flight=kw.pop("max_in_flight", 50),
                   **client_opts, **kw)
    readers.append(r)
    return r


bodies = [f"m{i}".encode() for i in range(n)]
writer = nsq.Writer([address], **client_opts)
t0 = time.monotonic()

if scenario in ("basic", "mpub"):
    def handler(message):
        record(message)
        if len(result["received"]) >= n:
            loop.call_later(0.3, done)
        return True
    reader("c", handler)
    pub_all(writer, bodies, "mpub" if scenario == "mpub" else "pub")

elif scenario == "requeue":
    def handler(message):
        record(message)
        if message.attempts == 1:
            message.requeue(backoff=False, delay=0)
            return None
        if sum(1 for r in result["received"] if r[2] == 2) >= n:
            loop.call_later(0.3, done)
        return True
    reader("c", handler, max_tries=0)
    pub_all(writer, bodies)

elif scenario == "timeout":
    def handler(message):
        record(message)
        if message.attempts == 1:
            message.enable_async()  # never answered: nsqd must time it out
            return None
        if sum(1 for r in result["received"] if r[2] == 2) >= n:
            loop.call_later(0.3, done)
        return True
    reader("c", handler, msg_timeout=1, max_tries=0)
    pub_all(writer, bodies)

elif scenario == "touch":
    def handler(message):
        record(message)
        message.enable_async()
        for k in range(1, 5):
            loop.call_later(0.4 * k, message.touch)
        loop.call_later(2.0, message.finish)
        loop.call_later(3.5, done)
    reader("c", handler, msg_timeout=1, max_tries=0)
    pub_all(writer, bodies)

elif scenario == "dpub":
    def handler(message):
        record(message)
        result.setdefault("delays", []).append(time.monotonic() - t0)
        if len(result["received"]) >= n:
            loop.call_later(0.2, done)
        return True
    reader("c", handler)
    pub_all(writer, bodies, "dpub")

elif scenario == "two_channels":
    def make(channel):
        def handler(message):
            record(message, channel)
            if len(result["received"]) >= 2 * n:
                loop.call_later(0.3, done)
            return True
        return handler
    reader("a", make("a"))
    reader("b", make("b"))
    pub_all(writer, bodies)

elif scenario == "shared":
    def make(name):
        def handler(message):
            record(message, name)
            if len(result["received"]) >= n:
                loop.call_later(0.3, done)
            return True
        return handler
    for k in range(3):
        reader("c", make(f"r{k}"), max_in_flight=5)
    pub_all(writer, bodies)

elif scenario == "sampled":  # all n in one MPUB; whatever comes in 3 s (sample_rate in opts)
    def handler(message):
        record(message)
        return True
    reader("c", handler)
    pub_all(writer, bodies, "mpub")
    loop.call_later(3, done)

elif scenario == "requeue_always":  # the server dead-letters at 3 attempts (test_policy.py)
    def handler(message):
        record(message)
        message.requeue(backoff=False, delay=0)
        if len(result["received"]) >= 3 * n:
            loop.call_later(1.0, done)  # (a 4th delivery would show by then)
        return None
    reader("c", handler, max_tries=0)
    pub_all(writer, bodies)
    loop.call_later(30, done)

else:
    raise SystemExit(f"unknown scenario {scenario}")

loop.call_later(25, done)  # never hang a test
loop.start()
result["elapsed"] = time.monotonic() - t0
print(json.dumps(result))
