"""The commands youzan/go-nsq sends (command.go, producer.go, conn.go), byte for byte:
for tests, the load generator and any Python client of a Youzan-speaking broker.

    <VERB> <param> ...\\n[4 BE body size][body]   (body only for IDENTIFY, PUB..., AUTH)

go-nsq writes the partition as strconv.Itoa(pid); IDs as the 16 bytes it received.
"""

import json
import struct

from nsqshm.youzan.bodies import TRACE_ID_KEY


def _word(v):
    return v if isinstance(v, bytes) else str(v).encode()


def command(verb, *params, body=None):
    """Command.WriteTo: name, " param" each, "\\n", then the sized body if any."""
    line = b" ".join((_word(verb), *map(_word, params))) + b"\n"
    if body is None:
        return line
    return line + struct.pack(">I", len(body)) + bytes(body)


def identify(extend_support=False, desired_tag="", **fields):
    """conn.go identify(): go-nsq sends desired_tag always ("" when unset) and
    extend_support only when true (the lookup said the topic is ext)."""
    data = dict(fields)
    data["feature_negotiation"] = True
    data["desired_tag"] = desired_tag
    if extend_support:
        data["extend_support"] = True
    return command("IDENTIFY", body=json.dumps(data, separators=(",", ":")).encode())


def sub(topic, channel, partition=None):
    """Subscribe / SubscribeWithPart."""
    return command("SUB", topic, channel, *(() if partition is None else (partition,)))


def sub_advanced(topic, channel, partition=None, start=None):
    """SubscribeAndTrace / SubscribeWithPartAndTrace / SubscribeAdvanced (start: the
    "<type>:<value>" text, a ConsumeOffset or str)."""
    params = [topic, channel]
    if partition is not None:
        params.append(partition)
        if start is not None:
            params.append(str(start))
    return command("SUB_ADVANCED", *params)


def sub_ordered(topic, channel, partition):
    return command("SUB_ORDERED", topic, channel, partition)


def pub(topic, body, partition=None):
    """Publish / PublishWithPart."""
    return command("PUB", topic, *(() if partition is None else (partition,)), body=body)


def _mpub_body(blocks):
    return struct.pack(">I", len(blocks)) + b"".join(
        struct.pack(">i", len(b)) + bytes(b) for b in blocks)


def mpub(topic, bodies, partition=None):
    """MultiPublish / MultiPublishWithPart."""
    return command("MPUB", topic, *(() if partition is None else (partition,)),
                   body=_mpub_body(bodies))


def pub_trace(topic, partition, trace_id, body):
    """PublishTrace: the 8-byte trace ID before the body."""
    return command("PUB_TRACE", topic, partition, body=struct.pack(">Q", trace_id) + body)


def mpub_trace(topic, partition, trace_ids, bodies):
    """MultiPublishTrace: each block is [8 trace id][body], its size counting the 8."""
    return command("MPUB_TRACE", topic, partition, body=_mpub_body(
        [struct.pack(">Q", t) + b for t, b in zip(trace_ids, bodies, strict=True)]))


def ext_json(trace_id=0, dispatch_tag="", custom=None):
    """MsgExt.ToJson: a JSON object with sorted keys (Go marshals a map), "" for none."""
    headers = dict(custom or {})
    if trace_id > 0:
        headers[TRACE_ID_KEY] = str(trace_id)
    if dispatch_tag:
        headers["##client_dispatch_tag"] = dispatch_tag
    if not headers:
        return b""
    return json.dumps(headers, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def _ext_block(headers, body):
    return struct.pack(">H", len(headers)) + bytes(headers) + bytes(body)


def pub_ext(topic, partition, headers, body):
    """PUB_EXT (doc/Message-Extend-Header-Design.md): [2 header length][JSON][body]."""
    return command("PUB_EXT", topic, partition, body=_ext_block(headers, body))


def mpub_ext(topic, partition, messages):
    """MPUB_EXT: messages are (headers JSON, body) pairs."""
    return command("MPUB_EXT", topic, partition,
                   body=_mpub_body([_ext_block(h, b) for h, b in messages]))


def create_topic(topic, partition):
    """CreateTopic: INTERNAL_CREATE_TOPIC (go-nsq never sends an ext word)."""
    return command("INTERNAL_CREATE_TOPIC", topic, partition)


def fin(msg_id):
    return b"FIN " + bytes(msg_id) + b"\n"


def req(msg_id, delay_ms):
    return b"REQ " + bytes(msg_id) + b" " + str(int(delay_ms)).encode() + b"\n"


def touch(msg_id):
    return b"TOUCH " + bytes(msg_id) + b"\n"
