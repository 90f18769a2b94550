"""The HTTP routes of issue 18 (nsqd has none of them), in nsqd's style:
query parameters, JSON answers, errors as {"message": "TEXT"} with nsqd's
status codes and texts where nsqd has one (MISSING_ARG_TOPIC,
TOPIC_NOT_FOUND, CHANNEL_NOT_FOUND...).

    GET  /topic/peek?topic=&n=                 peek.py
    GET  /channel/peek?topic=&channel=&n=      peek.py
    POST /topic/policy?topic=[&ttl=][&max_depth=][&max_bytes=][&overflow=]   policy.py, bounds.py
    POST /channel/policy?topic=&channel=[&ttl=][&max_attempts=][&dead_letter_topic=]
                        [&max_depth=][&max_bytes=][&overflow=]  (ttl in ms; 0 turns a setting off)
    POST /channel/redrive?topic=&channel=[&n=|&id=...]  policy.redrive: n dead
                                               letters, all, or those with these IDs

A policy route answers the policy after the change (only the parameters
given change; without any, it answers the current one).  The HTTP API
(http_api.HTTPAPI) passes itself and its error class in, so that this
module needs nothing of it.
"""

from nsqshm.nsqd.names import is_valid_name
from nsqshm.nsqd.policies import peek, policy

# query parameter -> policy key
CHANNEL_PARAMS = {"ttl": "ttl_ms", "max_attempts": "max_attempts",
                  "dead_letter_topic": "dead_letter_topic",
                  "dead_letter_expired": "dead_letter_expired", "max_depth": "max_depth",
                  "max_bytes": "max_bytes", "overflow": "overflow"}
BOUND_PARAMS = ("max_depth", "max_bytes", "overflow")
TOPIC_PARAMS = {"ttl": "ttl_ms", "max_depth": "max_depth", "max_bytes": "max_bytes",
                "overflow": "overflow"}


class PolicyRoutes:
    def __init__(self, api, err):
        self.api = api
        self.nsqd = api.nsqd
        self.Err = err

    def routes(self):
        """(method, path, handler) for http_api's router."""
        return [("GET", "/topic/peek", self.topic_peek),
                ("GET", "/channel/peek", self.channel_peek),
                ("POST", "/topic/policy", self.topic_policy),
                ("POST", "/channel/policy", self.channel_policy),
                ("POST", "/channel/redrive", self.channel_redrive)]

    # -- helpers ---------------------------------------------------------------------

    def _topic(self, values):
        names = values.get("topic")
        if names is None:
            raise self.Err(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(names[0]):
            raise self.Err(400, "INVALID_TOPIC")
        topic = self.nsqd.get_existing_topic(names[0])
        if topic is None:
            raise self.Err(404, "TOPIC_NOT_FOUND")
        return topic

    def _n(self, values, default):
        if "n" not in values:
            return default
        text = values["n"][0]
        if not (text.isascii() and text.isdigit()) or len(text) > 6 or not 1 <= int(text) <= peek.PEEK_MAX:
            raise self.Err(400, "INVALID_N")
        return int(text)

    # -- peek -------------------------------------------------------------------------

    def topic_peek(self, req):
        values = self.api._params(req)
        topic = self._topic(values)
        if topic.is_log:  # its log is read with /message/get
            raise self.Err(400, "NOT_SUPPORTED_ON_LOG_TOPIC")
        return self._peek(topic, None, self._n(values, peek.PEEK_DEFAULT))

    def channel_peek(self, req):
        values = self.api._params(req)
        channel = self.api._existing_channel(req)
        return self._peek(channel.topic, channel, self._n(values, peek.PEEK_DEFAULT))

    def _peek(self, topic, channel, n):
        doc = peek.peek(self.nsqd, topic, channel, n)
        if doc is None:  # the topic's owner did not answer
            raise self.Err(500, "INTERNAL_ERROR")
        return doc

    # -- policies ---------------------------------------------------------------------

    def topic_policy(self, req):
        values = self.api._params(req)
        topic = self._topic(values)
        return self._set(values, topic, None, TOPIC_PARAMS)

    def channel_policy(self, req):
        values = self.api._params(req)
        channel = self.api._existing_channel(req)
        return self._set(values, channel.topic, channel, CHANNEL_PARAMS)

    def _set(self, values, topic, channel, params):
        if topic.is_log and (channel is None or any(k in values for k in BOUND_PARAMS)):
            # a log topic keeps everything until retention: no topic policy, no bound
            raise self.Err(400, "NOT_SUPPORTED_ON_LOG_TOPIC")
        raw = {key: values[param][0] for param, key in params.items() if param in values}
        target = channel if channel is not None else topic
        try:
            parsed = policy.parse_values(raw, channel is not None, topic.name,
                                         channel.name if channel is not None else "")
            if channel is not None:
                policy.check_dead_letter_name(topic.name, channel.name, parsed, channel.policy)
        except policy.PolicyError as err:
            raise self.Err(400, str(err)) from None
        if parsed:
            policy.set_policy(self.nsqd, topic, channel, parsed)
        current = target.policy or policy.Policy()
        out = {"ttl_ms": current.ttl_ms, "max_depth": current.max_depth,
               "max_bytes": current.max_bytes, "overflow": current.overflow}
        if channel is not None:
            out["max_attempts"] = current.max_attempts
            out["dead_letter_topic"] = (
                policy.dead_letter_topic(channel)
                if current.max_attempts or current.dead_letter_expired
                else current.dead_letter_topic)
            out["dead_letter_expired"] = current.dead_letter_expired
        return out

    # -- redrive ----------------------------------------------------------------------

    def channel_redrive(self, req):
        values = self.api._params(req)
        channel = self.api._existing_channel(req)
        n = None
        if "n" in values:
            text = values["n"][0]
            if not (text.isascii() and text.isdigit()) or len(text) > 12 or int(text) < 1:
                raise self.Err(400, "INVALID_N")
            n = int(text)
        ids = values.get("id") or None
        if ids is not None and (len(ids) > policy.REDRIVE_IDS_MAX or
                                not all(policy.is_message_id(i) for i in ids)):
            raise self.Err(400, "INVALID_MESSAGE_ID")
        if ids is not None and n is not None:
            raise self.Err(400, "N_AND_ID_EXCLUSIVE")
        moved, error = policy.redrive_anywhere(self.nsqd, channel, n, ids)
        if error == "DEAD_LETTER_TOPIC_HAS_CHANNELS":
            raise self.Err(409, error)
        if error is not None:
            raise self.Err(500, "INTERNAL_ERROR")
        return {"moved": moved}
