"""Streaming read of log topics: Spark's offsets are the partitions' msg
offsets ({"topic": {"0": 23, "1": 40}}, logoffsets), so a micro-batch is a
fixed offset range per partition that Spark writes to its offset log before
running it.  A restarted query reads exactly the batch it had planned, and
with an idempotent sink (Spark's file sink, foreachBatch keyed by batch id)
the output holds every message once.

    initialOffset        startingOffsets / startingOffsetsByTimestamp /
                         startingTimestamp resolved against the logs
                         (default latest, as Kafka's)
    latestOffset         subscribePattern's topics made since (_discover), then
                         the logs' ends, capped by the read limit (Kafka's
                         maxOffsetsPerTrigger shared in proportion to what each
                         partition has; minOffsetsPerTrigger waits, at most
                         maxTriggerDelay since the last batch) and, with
                         Trigger.AvailableNow, by the ends when it began
    partitions           one LogRange per partition with data (split further
                         by minPartitions)
    commit               with a `channel` option, the channel's cursors follow
                         the committed offsets (/channel/setoffset), so its lag
                         shows in /stats and nsqadmin

Nothing is held between batches: the reader keeps no messages, only the
availableNow target and the cursor positions last set.
"""

import logging
import time

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from nsqshm.spark.logtopics import logrange
from nsqshm.spark.logtopics.logbatch import positions
from nsqshm.spark.logtopics.logoffsets import decode, encode, rate_limit
from nsqshm.spark.logtopics.logtopic import LogTopic
from nsqshm.youzan.offset import count_of

log = logging.getLogger("nsqshm.spark")


class LogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options, log_topics):
        self.o = options
        self.log_topics = log_topics
        self.target = None        # availableNow: {(topic, p): end}
        self.cursor_at = {}       # (topic, p): the channel cursor last set
        self.channel_made = False
        self.last_trigger_ms = 0  # Kafka's lastTriggerMillis: the first check triggers

    def _spans(self):
        """{(topic, p): (log start, log end)}."""
        spans = {}
        for name, lt in self.log_topics.items():
            for p, span in lt.offsets().items():
                spans[(name, p)] = span
        return spans

    def _ends(self):
        return {tp: end for tp, (_, end) in self._spans().items()}

    def initialOffset(self):
        o = self.o
        held = {name: lt.offsets() for name, lt in self.log_topics.items()}
        return encode(positions("startingOffsets", o, self.log_topics, o.starting_raw,
                                o.starting_by_time, o.starting_ms, "latest", held))

    def getDefaultReadLimit(self):
        # (Python's read limits have no composite one: with both options Spark gets
        # the maximum, and latestOffset applies the minimum from the options first,
        # as Kafka's composite limit does)
        if self.o.max_per_trigger:
            return ReadMaxRows(self.o.max_per_trigger)
        if self.o.min_per_trigger:
            return ReadMinRows(self.o.min_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self):
        self.target = self._ends()

    def _discover(self):
        """subscribePattern: a log topic made since the query began that the
        pattern matches joins it, read from its earliest offset (Kafka's
        consumer finds new topics by its metadata refresh; here at every
        trigger).  Not under Trigger.AvailableNow: that reads what there was
        when it began."""
        o = self.o
        if o.pattern is None or self.target is not None:
            return
        for name in LogTopic.names(o):
            if name not in self.log_topics and o.pattern.fullmatch(name):
                lt = LogTopic.find(o, name)
                if lt is not None:
                    log.info("log topic %s matches subscribePattern %r: read from its "
                             "earliest offset", name, o.pattern.pattern)
                    self.log_topics[name] = lt

    def latestOffset(self, start, limit):
        # Spark asks for the batch after `start` once the batch ending there
        # is in its commit log: the cursor may follow now (commit() comes a
        # batch later, and never for the last batch of an availableNow query)
        self._advance_cursor(start)
        self._discover()
        begin = {(t, p): off for t, parts in decode(start).items() for p, off in parts.items()}
        spans = self._spans()
        for tp, (log_start, _) in spans.items():
            if tp not in begin:  # a topic the pattern found after the query began
                log.info("%s partition %d is new to the query: read from its earliest "
                         "offset %d", tp[0], tp[1], log_start)
                begin[tp] = log_start
        latest = self._check_went_back(begin, {tp: end for tp, (_, end) in spans.items()})
        if self.target is not None:
            latest = {tp: min(end, self.target.get(tp, end)) for tp, end in latest.items()}
        minimum = limit.min_rows if isinstance(limit, ReadMinRows) else \
            self.o.min_per_trigger if isinstance(limit, ReadMaxRows) else 0
        if minimum and self.target is None and self._delay_batch(minimum, begin, latest):
            return start
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        out = {}
        for (t, p), off in latest.items():
            out.setdefault(t, {})[p] = off
        return encode(out)

    def _delay_batch(self, minimum, begin, latest):
        """Kafka's delayBatch: no batch while fewer than `minimum` offsets wait,
        unless maxTriggerDelay has passed since the last batch."""
        now = time.time() * 1000
        if now - self.last_trigger_ms >= self.o.max_trigger_delay_ms:
            self.last_trigger_ms = now
            return False
        if sum(latest[tp] - begin[tp] for tp in latest) < minimum:
            return True
        self.last_trigger_ms = now
        return False

    def _check_went_back(self, begin, latest):
        """A log that ends before the query's offset was deleted and made
        again (or lost its unsynced tail with its host): data loss, as
        Kafka's source treats an offset that went back.  Without
        failOnDataLoss the query goes on from the new end."""
        from nsqshm.spark.logtopics.logrange import DataLossError

        for (t, p), end in latest.items():
            at = begin[(t, p)]
            if end >= at:
                continue
            text = (f"{t} partition {p} ends at offset {end}, before offset {at} that the "
                    f"query reached: the topic was deleted and made again, or its log lost "
                    f"its tail; some data may have been missed. If you want your streaming "
                    f'query to go on from the new end, set the source option "failOnDataLoss" '
                    f'to "false".')
            if self.o.fail_on_data_loss:
                raise DataLossError(text)
            log.warning(text)
        return latest

    def reportLatestOffset(self):
        out = {}
        for (t, p), end in self._ends().items():
            out.setdefault(t, {})[p] = end
        return encode(out)

    def partitions(self, start, end):
        return logrange.plan(self.log_topics, decode(start), decode(end), self.o)

    def read(self, partition):
        return logrange.read(partition)

    def commit(self, end):
        self._advance_cursor(end)

    def stop(self):
        for lt in self.log_topics.values():
            lt.close()

    # -- the channel's cursor ---------------------------------------------------------------

    def _advance_cursor(self, offset):
        """POST /channel/setoffset for each partition whose committed offset
        moved.  A failure is logged, not raised: the cursor only shows lag."""
        if not self.o.channel_given:
            return
        from urllib.parse import quote

        from nsqshm.spark.connect import http_post

        channel = quote(self.o.channel, safe="")
        for name, parts in decode(offset).items():
            lt = self.log_topics.get(name)
            if lt is None or not lt.http_address:
                continue
            topic = quote(name, safe="")
            try:
                if not self.channel_made:
                    http_post(lt.http_address, f"/channel/create?topic={topic}&channel={channel}")
                for p, off in parts.items():
                    if self.cursor_at.get((name, p)) == off:
                        continue
                    http_post(lt.http_address, f"/channel/setoffset?topic={topic}"
                                               f"&channel={channel}&partition={p}",
                              body=f"msgcount:{count_of(off)}".encode())
                    self.cursor_at[(name, p)] = off
            except OSError as err:
                log.warning("nsqshm: channel %s of %s: cursor not moved to %s - %s",
                            self.o.channel, name, parts, err)
        self.channel_made = True
