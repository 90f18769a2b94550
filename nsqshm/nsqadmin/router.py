"""Routes with several parameters (httprouter's "/api/topics/:topic/:channel"),
for the router nsqd's API already has (nsqshm.nsqd.http_api.Router: its
404/405/redirect/OPTIONS rules are httprouter's, and nsqadmin's).

A ``raw`` route answers with a complete werkzeug Response of its own (the
HTML pages, static assets, the graphite proxy) instead of a V1 body.
"""

import posixpath

from nsqshm.nsqd.http_api import Err, Route
from nsqshm.nsqd.names import is_valid_name


def join_base(base, path):
    """path.Join(basePath, p), as nsqadmin mounts every route."""
    joined = posixpath.normpath(posixpath.join(base or "/", path.lstrip("/")))
    return "/" + joined.lstrip("/")


class PatternRoute(Route):
    def __init__(self, method, path, handler, raw=False, plain=False, log=True):
        super().__init__(method, path, handler, plain=plain, log=log)
        self.segments = path.split("/")
        self.raw = raw

    def _match(self, path, fold):
        parts = path.split("/")
        if len(parts) != len(self.segments):
            return None
        params, spelled = {}, []
        for seg, part in zip(self.segments, parts, strict=True):
            if seg.startswith(":"):
                if not part:
                    return None
                params[seg[1:]] = part
                spelled.append(part)
            elif seg == part or (fold and seg.lower() == part.lower()):
                spelled.append(seg)
            else:
                return None
        return params, "/".join(spelled)

    def match(self, path):
        found = self._match(path, fold=False)
        return None if found is None else found[0]

    def match_fold(self, path):
        found = self._match(path, fold=True)
        return None if found is None else found[1]


def check_topic(name):
    if not is_valid_name(name):
        raise Err(400, "INVALID_TOPIC")


def check_channel(name):
    if not is_valid_name(name):
        raise Err(400, "INVALID_CHANNEL")
