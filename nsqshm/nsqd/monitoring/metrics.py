"""GET /metrics on nsqd's HTTP port: the /stats numbers in Prometheus' text
format (an nsqshm addition; nsqd 1.3 has only /stats and statsd).

    nsq_topic_depth{topic}                      gauge    messages queued (memory + disk)
    nsq_topic_backend_depth{topic}              gauge    of which on disk
    nsq_topic_messages_total{topic}             counter  messages published
    nsq_topic_message_bytes_total{topic}        counter  body bytes published
    nsq_topic_paused{topic}                     gauge    1 when paused
    nsq_channel_depth{topic,channel}            gauge
    nsq_channel_backend_depth{topic,channel}    gauge
    nsq_channel_in_flight{topic,channel}        gauge    delivered, not yet finished
    nsq_channel_deferred{topic,channel}         gauge
    nsq_channel_messages_total{topic,channel}   counter  messages the channel received
    nsq_channel_requeued_total{topic,channel}   counter
    nsq_channel_timed_out_total{topic,channel}  counter
    nsq_channel_clients{topic,channel}          gauge    subscribed consumers
    nsq_channel_paused{topic,channel}           gauge
    nsq_channel_expired_total{topic,channel}    counter  dropped by a time to live  } topics and
    nsq_channel_dead_lettered_total{topic,channel} counter  to the dead-letter topic } channels
    nsq_{topic,channel}_rejected_total{...}     counter  refused by a bound        } with a
    nsq_{topic,channel}_dropped_total{...}      counter  dropped by a bound        } policy
    nsq_partition_start_offset{topic,partition} gauge    a log topic's first offset held
    nsq_partition_end_offset{topic,partition}   gauge    its next offset (messages appended)
    nsq_channel_partition_confirmed_offset{topic,channel,partition}
                                                gauge    a log channel's cursor: all below done
    nsq_channel_partition_lag{topic,channel,partition}
                                                gauge    end offset - confirmed offset
    nsq_clients                                 gauge    connected TCP clients
    nsq_producers                               gauge    of which have published
    nsq_health                                  gauge    1 when /ping answers OK
    nsq_info{version}                           gauge    always 1
    nsq_workers                                 gauge    workers that answered the scrape
    nsq_memory_<key>                            gauge    /stats' memory section (every worker's)
    process_*                                   the broker's processes together (below)
    nsqshm_process_<metric>{process}            gauge    each process: "supervisor", "worker 0", ...

The values come from the same code as /stats (nsqshm.nsqd.monitoring.stats.broker_stats),
read at scrape time, and describe the whole broker whichever worker answers.
process_* are prometheus_client's process metrics summed over the supervisor
and every worker (cpu, resident and virtual memory, open fds; shared-memory
pages mapped by several processes count in each one's resident memory), with
the supervisor's start time (the broker's) and max fds.
"""

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

from nsqshm.nsqd.monitoring.stats import MEM_KEYS, broker_stats

ENVIRON_KEY = "nsqshm.metrics"


class NSQDCollector:
    def __init__(self, nsqd):
        self.nsqd = nsqd

    def describe(self):
        return []  # no fixed set: topics and channels come and go

    def collect(self):
        nsqd = self.nsqd
        broker = broker_stats(nsqd, "", "", False, include_mem=True)
        topics = broker["topics"]
        t_labels = ["topic"]
        c_labels = ["topic", "channel"]
        t_depth = GaugeMetricFamily("nsq_topic_depth", "Messages queued in the topic",
                                    labels=t_labels)
        t_backend = GaugeMetricFamily("nsq_topic_backend_depth",
                                      "Messages of the topic queued on disk", labels=t_labels)
        t_msgs = CounterMetricFamily("nsq_topic_messages", "Messages published to the topic",
                                     labels=t_labels)
        t_bytes = CounterMetricFamily("nsq_topic_message_bytes",
                                      "Body bytes published to the topic", labels=t_labels)
        t_paused = GaugeMetricFamily("nsq_topic_paused", "1 when the topic is paused",
                                     labels=t_labels)
        c_depth = GaugeMetricFamily("nsq_channel_depth", "Messages queued in the channel",
                                    labels=c_labels)
        c_backend = GaugeMetricFamily("nsq_channel_backend_depth",
                                      "Messages of the channel queued on disk", labels=c_labels)
        c_inflight = GaugeMetricFamily("nsq_channel_in_flight",
                                       "Messages delivered and not yet finished",
                                       labels=c_labels)
        c_deferred = GaugeMetricFamily("nsq_channel_deferred", "Deferred messages",
                                       labels=c_labels)
        c_msgs = CounterMetricFamily("nsq_channel_messages", "Messages the channel received",
                                     labels=c_labels)
        c_requeued = CounterMetricFamily("nsq_channel_requeued", "Messages requeued",
                                         labels=c_labels)
        c_timed_out = CounterMetricFamily("nsq_channel_timed_out", "Messages timed out",
                                          labels=c_labels)
        c_clients = GaugeMetricFamily("nsq_channel_clients", "Consumers subscribed",
                                      labels=c_labels)
        c_paused = GaugeMetricFamily("nsq_channel_paused", "1 when the channel is paused",
                                     labels=c_labels)
        c_expired = CounterMetricFamily("nsq_channel_expired",
                                        "Messages dropped by a time to live (policy.py)",
                                        labels=c_labels)
        c_dead = CounterMetricFamily("nsq_channel_dead_lettered",
                                     "Messages moved to the dead-letter topic",
                                     labels=c_labels)
        p_labels, cp_labels = ["topic", "partition"], ["topic", "channel", "partition"]
        p_start = GaugeMetricFamily("nsq_partition_start_offset",
                                    "A log topic partition's first offset held", labels=p_labels)
        p_end = GaugeMetricFamily("nsq_partition_end_offset",
                                  "A log topic partition's next offset", labels=p_labels)
        cp_confirmed = GaugeMetricFamily("nsq_channel_partition_confirmed_offset",
                                         "A log channel's cursor: every offset below it finished",
                                         labels=cp_labels)
        cp_lag = GaugeMetricFamily("nsq_channel_partition_lag",
                                   "A log channel's offsets not yet confirmed", labels=cp_labels)
        bound = {(kind, what): CounterMetricFamily(
            f"nsq_{kind}_{what}", f"Messages {what} by a bounded queue (bounds.py)",
            labels=t_labels if kind == "topic" else c_labels)
            for kind in ("topic", "channel") for what in ("rejected", "dropped")}
        for t in topics or ():
            name = [t["topic_name"]]
            t_depth.add_metric(name, t["depth"])
            t_backend.add_metric(name, t["backend_depth"])
            t_msgs.add_metric(name, t["message_count"])
            t_bytes.add_metric(name, t["message_bytes"])
            t_paused.add_metric(name, 1 if t["paused"] else 0)
            for part in t.get("partitions") or ():  # a log topic's (logtopic.partition_stats)
                p_start.add_metric([*name, str(part["partition"])], part["start_offset"])
                p_end.add_metric([*name, str(part["partition"])], part["end_offset"])
            if "rejected_count" in t:  # a topic with a policy (policy.topic_stats)
                bound["topic", "rejected"].add_metric(name, t["rejected_count"])
                bound["topic", "dropped"].add_metric(name, t["dropped_count"])
            for c in t["channels"]:
                names = [t["topic_name"], c["channel_name"]]
                c_depth.add_metric(names, c["depth"])
                c_backend.add_metric(names, c["backend_depth"])
                c_inflight.add_metric(names, c["in_flight_count"])
                c_deferred.add_metric(names, c["deferred_count"])
                c_msgs.add_metric(names, c["message_count"])
                c_requeued.add_metric(names, c["requeue_count"])
                c_timed_out.add_metric(names, c["timeout_count"])
                c_clients.add_metric(names, c["client_count"])
                c_paused.add_metric(names, 1 if c["paused"] else 0)
                for part in c.get("partitions") or ():  # a log channel's cursors
                    cp_confirmed.add_metric([*names, str(part["partition"])],
                                            part["confirmed_offset"])
                    cp_lag.add_metric([*names, str(part["partition"])], part["lag"])
                if "expired_count" in c:  # a channel with a policy (policy.channel_stats)
                    c_expired.add_metric(names, c["expired_count"])
                    c_dead.add_metric(names, c["dead_letter_count"])
                    bound["channel", "rejected"].add_metric(names, c["rejected_count"])
                    bound["channel", "dropped"].add_metric(names, c["dropped_count"])
        yield from (t_depth, t_backend, t_msgs, t_bytes, t_paused, c_depth, c_backend,
                    c_inflight, c_deferred, c_msgs, c_requeued, c_timed_out, c_clients, c_paused,
                    c_expired, c_dead, *bound.values(), p_start, p_end, cp_confirmed, cp_lag)
        yield GaugeMetricFamily("nsq_clients", "Connected TCP clients",
                                value=broker["client_count"])
        yield GaugeMetricFamily("nsq_producers", "Connected TCP clients that have published",
                                value=broker["producer_count"])
        yield GaugeMetricFamily("nsq_health", "1 when the broker is healthy (/ping answers OK)",
                                value=1 if nsqd.health == "OK" else 0)
        info = GaugeMetricFamily("nsq_info", "The nsqd version this broker is compatible with",
                                 labels=["version"])
        info.add_metric([str(nsqd.version)], 1)
        yield info
        yield GaugeMetricFamily("nsq_workers", "Workers that answered this scrape",
                                value=len(broker["workers"]))
        for key in MEM_KEYS:
            yield GaugeMetricFamily(f"nsq_memory_{key}", f"/stats memory {key}, every worker's",
                                    value=broker["memory"][key])
        processes = [(f"worker {index}", pid) for index, pid in broker["workers"]]
        if not getattr(nsqd, "publish_instance", True):  # run by a supervisor
            processes.insert(0, ("supervisor", os.getppid()))
        yield from process_metrics(processes)


# how the broker's processes add up: summed, or the supervisor's (the first)
_PROCESS_SUMMED = ("process_virtual_memory_bytes", "process_resident_memory_bytes",
                   "process_cpu_seconds_total", "process_open_fds")


def process_metrics(processes):
    """process_* of the broker ((name, pid) of each process, the supervisor
    first) and nsqshm_process_*{process} of each, read from /proc by
    prometheus_client's ProcessCollector."""
    totals, kinds, each = {}, {}, {}
    for name, pid in processes:
        for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():
            for sample in family.samples:
                kinds[sample.name] = family.type
                if sample.name in _PROCESS_SUMMED:
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
                else:
                    totals.setdefault(sample.name, sample.value)
                each.setdefault(sample.name, []).append((name, sample.value))
    for sample_name, value in totals.items():
        if kinds[sample_name] == "counter":
            yield CounterMetricFamily(sample_name.removesuffix("_total"),
                                      "Of the broker's processes together", value=value)
        else:
            yield GaugeMetricFamily(sample_name, "Of the broker's processes together",
                                    value=value)
    for sample_name, values in each.items():
        family = GaugeMetricFamily(f"nsqshm_{sample_name}", "Of each process of the broker",
                                   labels=["process"])
        for name, value in values:
            family.add_metric([name], value)
        yield family


def register(app):
    """Add GET /metrics to the nsqd app made by http_api.create_app."""
    api = app.nsq_api
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NSQDCollector(api.nsqd))  # process_* too, every process's

    def metrics(req):
        req.environ[ENVIRON_KEY] = True
        return generate_latest(registry)

    api.router.add_route("GET", "/metrics", metrics, plain=True)

    @app.after_request
    def content_type(req, response):
        if req.environ.get(ENVIRON_KEY) and response.status_code == 200:
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    return registry
