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


# -- Youzan's NSQ fork (log topics): its codes, in one place ------------------------------

E_BAD_PARTITION = "E_BAD_PARTITION"


def BAD_PARTITION(err):  # noqa: N802 (a code and its text, as the constants above)
    """Youzan's answer to a PUB/MPUB naming a partition that is not valid."""
    return E_BAD_PARTITION, f"topic partition is not valid: {err}"
