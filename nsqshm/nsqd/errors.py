"""Protocol errors as nsqd's internal/protocol/errors.go: a code and a text.

A FatalClientErr closes the connection right after its error frame; a
ClientErr (only E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED) leaves it open.
"""


class ClientErr(Exception):
    fatal = False

    def __init__(self, code, desc):
        super().__init__(f"{code} {desc}")
        self.code = code
        self.desc = desc

    @property
    def wire(self):
        return f"{self.code} {self.desc}".encode("utf-8", "surrogateescape")


class FatalClientErr(ClientErr):
    fatal = True


# The Youzan fork's codes (youzan/nsq nsqdserver/protocol_v2.go, nsqdserver/context.go,
# consistence/common.go, internal/ext/ext.go), as its nsqd sends them: "<code> <text>".
# Which answer is fatal (closes the connection) is told where each is raised: see
# docs/youzan.md (Errors) and nsqshm/youzan/.
E_TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"            # fatal, empty text: "E_TOPIC_NOT_EXIST "
E_BAD_PARTITION = "E_BAD_PARTITION"                # fatal
E_FAILED_ON_NOT_LEADER = "E_FAILED_ON_NOT_LEADER"  # fatal on SUB/FIN, not on PUB/MPUB
E_FAILED_ON_NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"
E_SUB_ORDER_IS_MUST = "E_SUB_ORDER_IS_MUST"        # fatal
SUB_ORDER_IS_MUST_TEXT = "this topic is configured only allow ordered sub"  # its text
E_SUB_EXTEND_NEED = "E_SUB_EXTEND_NEED"            # fatal
E_SUB_EXTEND_FORBIDDON = "E_SUB_EXTEND_FORBIDDON"  # fatal (Youzan's spelling)
E_SUB_CHANNEL_NOT_REGISTERED = "E_SUB_CHANNEL_NOT_REGISTERED"  # fatal
E_EXT_NOT_SUPPORT = "E_EXT_NOT_SUPPORT"            # not fatal
E_INVALID_JSON_HEADER = "E_INVALID_JSON_HEADER"    # not fatal
E_BAD_TAG = "E_BAD_TAG"                            # declared by Youzan, never sent by its nsqd
INVALID_TRACE_ID = "INVALID_TRACE_ID"              # not fatal; Youzan's code has no E_ prefix
E_PUB_TOO_MUCH_WAITING = "E_PUB_TOO_MUCH_WAITING"  # fatal
E_PUB_FAILED = "E_PUB_FAILED"                      # not fatal
E_MPUB_FAILED = "E_MPUB_FAILED"                    # not fatal (fatal in older Youzan versions)
E_BAD_EXT = "E_BAD_EXT"                            # fatal (INTERNAL_CREATE_TOPIC)
E_CREATE_TOPIC_FAILED = "E_CREATE_TOPIC_FAILED"    # not fatal (INTERNAL_CREATE_TOPIC)


def BAD_PARTITION(err):  # noqa: N802 (a code and its text, as the constants above)
    """Youzan's answer to a PUB/MPUB naming a partition that is not valid (or, for
    one the error says has its own code and text, that)."""
    text = getattr(err, "youzan_text", None)
    return (getattr(err, "youzan_code", E_BAD_PARTITION),
            f"topic partition is not valid: {err}" if text is None else text)
