"""The nsqlookupd master: of the cluster's nsqlookupd, one coordinates (places topics,
moves leaderships); the others stand by.  Youzan's etcd_master_lock.go holds a TTL key;
here the key is on the campaigning node's lease:

    /NSQMetaData/<cluster-id>/NsqlookupdInfo/LookupdLeaderSession   NodeInfo JSON, on the master's lease

A campaign creates the key if absent (one transaction), and watches it: when it is
deleted (the master resigned, died, or was cut off past its TTL), every standby tries
again and exactly one wins.  `callback(master)` says who is master (a NodeInfo, or
None while nobody is) each time that changes; `is_master` is this node's view.
"""

import json
import logging

import gevent

from nsqshm.consistence.errors import CoordinationError
from nsqshm.consistence.etcd.txn import Compare, Op
from nsqshm.consistence.topology import NodeInfo

log = logging.getLogger("nsqshm.consistence")

RETRY = 0.2  # seconds between campaigns while etcd does not answer


class Master:
    def __init__(self, topology, node, callback=None):
        self.session = topology.session
        self.key = topology.keys.root + "NsqlookupdInfo/LookupdLeaderSession"
        self.node = node
        self.callback = callback
        self.master = None  # NodeInfo of the current master, None while there is none
        self._create_revision = 0  # of our key while we hold it
        self._watch = None
        # a lost lease took our key along: campaign again on the new one
        self.session.on_new_lease(lambda session: self._watch and self._campaign_until_done())

    @property
    def is_master(self):
        return self.master is not None and self.master.id == self.node.id \
            and self.session.lease is not None and self.session.lease.alive

    def start(self):
        """Campaign now, and again whenever the key goes."""
        revision = self.session.revision()
        self._campaign()
        self._watch = self.session.watch(self.key, self._changed, start_revision=revision + 1)
        return self

    def stop(self, resign=True):
        if self._watch is not None:
            self.session.unwatch(self._watch)
            self._watch = None
        if resign:
            self.resign()

    def resign(self):
        """Give the mastership up at once (graceful stop) if we hold it."""
        if not self._create_revision:
            return False
        result = self.session.txn([Compare.create_revision(self.key, "=", self._create_revision)],
                                  [Op.delete(self.key)])
        self._create_revision = 0
        return result.succeeded

    def _campaign(self):
        lease = self.session.ensure_lease()
        result = self.session.txn(
            [Compare.absent(self.key)],
            [Op.put(self.key, json.dumps(self.node.to_json()), lease), Op.get(self.key)],
            [Op.get(self.key)])
        kvs = result.ranges[0] if result.ranges else ()
        if result.succeeded:
            self._create_revision = kvs[0].create_revision
            log.info("nsqlookupd %s is master", self.node.id)
        self._set(NodeInfo.from_json(json.loads(kvs[0].value)) if kvs else None)

    def _campaign_until_done(self):
        """Campaign, retried while etcd does not answer (nobody may be master until
        some standby gets through)."""
        while self._watch is not None:
            try:
                return self._campaign()
            except CoordinationError as err:
                log.info("master campaign failed (%s); retrying", err)
                gevent.sleep(RETRY)

    def _changed(self, events):
        for event in events:
            if event.type == "PUT":
                self._set(NodeInfo.from_json(json.loads(event.kv.value)))
                continue
            if event.type == "DELETE":
                self._create_revision = 0
                self._set(None)
            self._campaign_until_done()  # DELETE, or COMPACTED: read it again

    def _set(self, master):
        if master == self.master:
            return
        self.master = master
        if self.callback is not None:
            self.callback(master)
