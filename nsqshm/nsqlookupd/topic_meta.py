"""A log topic's `meta` for Youzan's lookup (`/lookup?...&metainfo=true`) on a
standalone nsqlookupd: how many partitions it has and whether it was made
with ext=true, asked of an nsqd that holds it (its /stats entry) and kept
for CACHE_SECONDS.

Youzan's standalone nsqlookupd answers no `meta` (only its etcd coordinator
knows topics), and youzan/go-nsq then cannot publish in order
(`PublishOrdered` wants `meta.partition_num`) nor turn `extend_support` on
for an ext topic by itself.  nsqshm's nsqd knows both, so a standalone
nsqshm lookupd gives them; `replica` is 1 (one copy, on that nsqd)."""

import http.client
import json
import time
from urllib.parse import quote

CACHE_SECONDS = 5.0
TIMEOUT = 2.0


class TopicMeta:
    def __init__(self):
        self._cache = {}  # topic -> (when, meta or None)

    def get(self, topic, peers):
        """{"partition_num", "replica", "extend_support"} of a log topic, from the
        first of `peers` (registration_db PeerInfo) that answers; None for a
        classic topic, or when none answers."""
        now = time.monotonic()
        hit = self._cache.get(topic)
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        meta = None
        for peer in peers:
            try:
                entry = _stats_entry(peer.broadcast_address, peer.http_port, topic)
            except (OSError, ValueError, http.client.HTTPException):
                continue
            if entry is not None and entry.get("partitions"):
                meta = {"partition_num": len(entry["partitions"]), "replica": 1,
                        "extend_support": bool(entry.get("is_ext"))}
            break
        else:  # nobody answered: what was known stays (a topic's layout does not change)
            meta = hit[1] if hit is not None else None
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[topic] = (now, meta)
        return meta


def _stats_entry(host, port, topic):
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request("GET", f"/stats?format=json&include_clients=false&topic={quote(topic)}")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            return None
        for entry in json.loads(body).get("topics") or ():
            if entry.get("topic_name") == topic:
                return entry
        return None
    finally:
        conn.close()
