"""A Reader that finds its nsqd through nsqlookupd, run as a subprocess by the tests:

    python lookupd_client.py LIBRARY LOOKUPD_HTTP[,LOOKUPD_HTTP...] TOPIC CHANNEL N

LIBRARY is pynsq (tornado Reader) or gnsq (gevent Consumer).  It consumes
until N messages arrived (or 30 s passed) and prints one JSON object:
{"received": [bodies], "nsqd": [the host:port it connected to]}."""

import sys

library, lookupds, topic, channel, n = sys.argv[1:6]
n = int(n)
lookupds = [f"http://{a}" for a in lookupds.split(",")]
result = {"received": [], "nsqd": []}

if library == "gnsq":
    import gevent.monkey

    gevent.monkey.patch_all()
    import json

    import gevent
    import gevent.event
    import gnsq

    done = gevent.event.Event()
    consumer = gnsq.Consumer(topic, channel, lookupd_http_addresses=lookupds,
                             lookupd_poll_interval=1, max_in_flight=50)

    @consumer.on_message.connect
    def handler(c, message):
        result["received"].append(message.body.decode())
        if len(result["received"]) >= n:
            done.set()

    gevent.spawn(consumer.start)
    done.wait(30)
    result["nsqd"] = sorted(f"{conn.address}:{conn.port}" for conn in consumer._connections)
    consumer.close()
    print(json.dumps(result))
else:
    import json

    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()

    def handler(message):
        result["received"].append(message.body.decode())
        if len(result["received"]) >= n:
            loop.call_later(0.1, finish)
        return True

    reader = nsq.Reader(topic=topic, channel=channel, message_handler=handler,
                        lookupd_http_addresses=lookupds, lookupd_poll_interval=1,
                        max_in_flight=50)

    def finish():
        result["nsqd"] = sorted(reader.conns)
        reader.close()
        loop.stop()

    loop.call_later(30, finish)
    loop.start()
    print(json.dumps(result))
