"""A gnsq (gevent) client in its own process, the TCP side of the local
client tests:

    python gnsq_peer.py consume HOST:PORT TOPIC CHANNEL N   -> JSON {"bodies": [...], "attempts": [...]}
    python gnsq_peer.py publish HOST:PORT TOPIC N PREFIX     -> JSON {"published": N}
"""

import gevent.monkey

gevent.monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402
import gnsq  # noqa: E402

mode, address = sys.argv[1:3]
if mode == "consume":
    topic, channel, n = sys.argv[3], sys.argv[4], int(sys.argv[5])
    got = {"bodies": [], "attempts": []}
    done = gevent.event.Event()
    consumer = gnsq.Consumer(topic, channel, nsqd_tcp_addresses=[address], max_in_flight=100)

    @consumer.on_message.connect
    def handler(_consumer, message):
        got["bodies"].append(message.body.decode())
        got["attempts"].append(message.attempts)
        message.finish()
        if len(got["bodies"]) >= n:
            done.set()

    gevent.spawn(consumer.start)
    done.wait(30)
    consumer.close()
    print(json.dumps(got))
else:
    topic, n, prefix = sys.argv[3], int(sys.argv[4]), sys.argv[5]
    producer = gnsq.Producer([address])
    producer.start()
    producer.multipublish(topic, [f"{prefix}{i}".encode() for i in range(n)])
    producer.close()
    print(json.dumps({"published": n}))
