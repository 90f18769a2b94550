"""Youzan's extended message headers on the delivery path, in C.

A message of an ext topic (POST /topic/create?ext=true) is stored, in rings,
disk queues and commit logs alike, with Youzan's ext part between nsqd's
header and the body (youzan/nsq nsqd/message.go, doc/Message-Extend-Header-Design.md):

    [8 BE timestamp][2 BE attempts][16 ID][1 ext version][2 BE n][n bytes JSON][body]
    0               8              10     26             27      29            29+n
                                          version 0 (no headers): [0][body], nothing else

which is byte for byte the data of Youzan's message frame for a client that
IDENTIFYed with extend_support.  So such a client gets the record as it is
stored; another client gets it with the ext part cut out (ExtView.strip), a
memmove in the frame after the in-flight copy is taken (a REQ or a timeout
puts back the record with its headers).

ExtView is one client's view of an ext topic, handed to InFlight.deliver:

    strip      cut the ext part from the frames (no extend_support)
    filter     IDENTIFY ext_filter (nsqd/ext_filter.go): a message that does not
               pass is confirmed for the channel without being sent (ACCEPT_SKIP)
    tag        IDENTIFY desired_tag, with the channel's TagSet: Youzan's
               dispatch by the "##client_dispatch_tag" header (ACCEPT_LEAVE
               leaves a message in the ring for another consumer)

Header values are read from the JSON in place (json_get_string: the
top-level key, unescaped): no Python object per message.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from libc.stdint cimport int32_t
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy

from nsqshm._core.codec cimport IdGenerator, put_message_header
from nsqshm._core.includes.system cimport (
    NSQSHM_EXPIRY_BIT, NSQSHM_EXPIRY_SIZE, nsqshm_put_be64,
)
from nsqshm._core.logcursor cimport CursorSet


cdef extern from "<regex.h>" nogil:
    ctypedef struct regex_t:
        pass
    ctypedef struct regmatch_t:
        pass
    int regcomp(regex_t *preg, const char *regex, int cflags)
    int regexec(const regex_t *preg, const char *string, size_t nmatch, regmatch_t *pmatch,
                int eflags)
    void regfree(regex_t *preg)
    int REG_EXTENDED
    int REG_NOSUB


cdef extern from "<fnmatch.h>" nogil:
    int fnmatch(const char *pattern, const char *string, int flags)


FILTER_EQUAL, FILTER_REGEXP, FILTER_GLOB, FILTER_MULTI = 1, 2, 3, 4
SKIP, DELIVER, LEAVE = ACCEPT_SKIP, ACCEPT_DELIVER, ACCEPT_LEAVE  # accept()'s verdicts
TAG_KEY = b"##client_dispatch_tag"     # internal/ext/ext.go CLIENT_DISPATCH_TAG_KEY
cdef uint64_t TTL_MS_MAX = 1ULL << 40  # nsqd/policies/message_ttl.py's (about 34 years)
MAX_HEADER_LENGTH = 0xFFFF             # the 2-byte n
cdef Py_ssize_t SCRATCH = MAX_HEADER_LENGTH + 1
cdef Py_ssize_t KEY_MAX = 256


cdef Py_ssize_t ext_prefix(const unsigned char *msg, Py_ssize_t size) noexcept nogil:
    """Bytes of the ext part after the 26-byte header: 1 for version 0, 3 + n
    for another version; 0 when the record has none (too short for it)."""
    cdef Py_ssize_t n
    if size <= EXT_OFFSET:
        return 0
    if msg[EXT_OFFSET] == NO_EXT_VER:
        return 1
    if size < EXT_OFFSET + 3:
        return 0
    n = (<Py_ssize_t>msg[EXT_OFFSET + 1] << 8) | msg[EXT_OFFSET + 2]
    if EXT_OFFSET + 3 + n > size:
        return 0
    return 3 + n


# -- a flat JSON object, read in place ----------------------------------------------------

cdef inline Py_ssize_t _ws(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    while i < n and (p[i] == 32 or p[i] == 9 or p[i] == 10 or p[i] == 13):
        i += 1
    return i


cdef inline int _hex4(const unsigned char *p) noexcept nogil:
    cdef int v = 0, k, c
    for k in range(4):
        c = p[k]
        if 48 <= c <= 57:
            v = (v << 4) | (c - 48)
        elif 97 <= c <= 102:
            v = (v << 4) | (c - 87)
        elif 65 <= c <= 70:
            v = (v << 4) | (c - 55)
        else:
            return -1
    return v


cdef inline Py_ssize_t _put(char *out, Py_ssize_t o, Py_ssize_t cap, unsigned int c) noexcept nogil:
    if out != NULL and o < cap:
        out[o] = <char>c
    return o + 1


cdef Py_ssize_t _put_rune(char *out, Py_ssize_t o, Py_ssize_t cap, unsigned int cp) noexcept nogil:
    if cp < 0x80:
        return _put(out, o, cap, cp)
    if cp < 0x800:
        o = _put(out, o, cap, 0xC0 | (cp >> 6))
    elif cp < 0x10000:
        o = _put(out, o, cap, 0xE0 | (cp >> 12))
        o = _put(out, o, cap, 0x80 | ((cp >> 6) & 0x3F))
    else:
        o = _put(out, o, cap, 0xF0 | (cp >> 18))
        o = _put(out, o, cap, 0x80 | ((cp >> 12) & 0x3F))
        o = _put(out, o, cap, 0x80 | ((cp >> 6) & 0x3F))
    return _put(out, o, cap, 0x80 | (cp & 0x3F))


cdef Py_ssize_t _string(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, char *out,
                        Py_ssize_t cap, Py_ssize_t *olen) noexcept nogil:
    """The string at p[i] == '"', unescaped into out (up to cap bytes; *olen
    its length, or -1 when longer): the index after it, or -1 (bad JSON).
    A lone surrogate escape becomes U+FFFD, as Go decodes it."""
    cdef Py_ssize_t o = 0
    cdef unsigned char c, e
    cdef int cp, lo
    i += 1
    while i < n:
        c = p[i]
        if c == 34:  # "
            olen[0] = o if o <= cap else -1
            return i + 1
        if c < 0x20:  # a control character: not JSON (Go refuses it)
            return -1
        if c != 92:  # not a backslash
            o = _put(out, o, cap, c)
            i += 1
            continue
        if i + 1 >= n:
            return -1
        e = p[i + 1]
        if e == 117:  # \uXXXX
            if i + 6 > n:
                return -1
            cp = _hex4(p + i + 2)
            if cp < 0:
                return -1
            i += 6
            if 0xD800 <= cp < 0xDC00 and i + 6 <= n and p[i] == 92 and p[i + 1] == 117:
                lo = _hex4(p + i + 2)
                if 0xDC00 <= lo < 0xE000:
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    i += 6
            if 0xD800 <= cp < 0xE000:
                cp = 0xFFFD
            o = _put_rune(out, o, cap, <unsigned int>cp)
            continue
        if e == 34 or e == 92 or e == 47:
            o = _put(out, o, cap, e)
        elif e == 98:
            o = _put(out, o, cap, 8)
        elif e == 102:
            o = _put(out, o, cap, 12)
        elif e == 110:
            o = _put(out, o, cap, 10)
        elif e == 114:
            o = _put(out, o, cap, 13)
        elif e == 116:
            o = _put(out, o, cap, 9)
        else:
            return -1
        i += 2
    return -1


cdef Py_ssize_t _skip(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """Past the value at p[i]: the index of the ',' or '}' after it, or -1."""
    cdef int depth = 0
    cdef unsigned char c
    cdef Py_ssize_t unused
    while i < n:
        c = p[i]
        if c == 34:
            i = _string(p, i, n, NULL, 0, &unused)
            if i < 0:
                return -1
            continue
        if c == 123 or c == 91:  # { [
            depth += 1
        elif c == 125 or c == 93:  # } ]
            if depth == 0:
                return i
            depth -= 1
        elif c == 44 and depth == 0:
            return i
        i += 1
    return -1


cdef Py_ssize_t json_unescape(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, char *out,
                              Py_ssize_t cap, Py_ssize_t *olen) noexcept nogil:
    """The string at p[i] == '"' unescaped into out (_string): the index after it, or -1."""
    return _string(p, i, n, out, cap, olen)


cdef Py_ssize_t _member_key(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, char *out,
                            Py_ssize_t cap, Py_ssize_t *olen) noexcept nogil:
    """A member's `"key" :` from p[i] (the key unescaped into out, as _string):
    the index of its value, or -1."""
    if i >= n or p[i] != 34:
        return -1
    i = _string(p, i, n, out, cap, olen)
    if i < 0:
        return -1
    i = _ws(p, i, n)
    if i >= n or p[i] != 58:  # :
        return -1
    i = _ws(p, i + 1, n)
    return i if i < n else -1


cdef Py_ssize_t json_member(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                            Py_ssize_t *key, Py_ssize_t *value,
                            Py_ssize_t *value_end) noexcept nogil:
    """Walk the members of the flat JSON object p[:n]: i is 0 on the first
    call, then what the last call returned.  > 0: one more member, its key's
    '"' at *key and its value's text at p[*value:*value_end]; 0: no more;
    -1: not a JSON object (what was found before it stands)."""
    cdef Py_ssize_t unused, j, e
    if i == 0:
        i = _ws(p, 0, n)
        if i >= n or p[i] != 123:  # {
            return -1
        i = _ws(p, i + 1, n)
        if i < n and p[i] == 125:  # }
            return 0
    else:  # i is at the ',' or '}' after the last value
        if i >= n or p[i] == 125:
            return 0
        i = _ws(p, i + 1, n)
    key[0] = i
    i = _member_key(p, i, n, NULL, 0, &unused)
    if i < 0:
        return -1
    j = _skip(p, i, n)
    if j < 0:
        return -1
    e = j
    while e > i and (p[e - 1] == 32 or p[e - 1] == 9 or p[e - 1] == 10 or p[e - 1] == 13):
        e -= 1
    if e == i:
        return -1
    value[0] = i
    value_end[0] = e
    return j


def json_members(json):
    """[(key, value)] of a flat JSON object as json_member walks it, string
    values unescaped, others as their JSON text (tests); ValueError when it
    is not an object."""
    cdef bytes j = bytes(json)
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(j)
    cdef Py_ssize_t n = len(j), i = 0, k = 0, v = 0, e = 0, olen = 0
    cdef bytearray out = bytearray(n + 1)
    found = []
    while True:
        i = json_member(p, i, n, &k, &v, &e)
        if i == 0:
            return found
        if i < 0:
            raise ValueError("not a flat JSON object")
        json_unescape(p, k, n, PyByteArray_AS_STRING(out), n, &olen)
        key = bytes(out[:olen])
        if p[v] == 34:
            json_unescape(p, v, n, PyByteArray_AS_STRING(out), n, &olen)
            found.append((key, bytes(out[:olen])))
        else:
            found.append((key, j[v:e]))


cdef int json_get_string(const unsigned char *p, Py_ssize_t n, const char *key,
                         Py_ssize_t klen, char *out, Py_ssize_t cap,
                         Py_ssize_t *olen) noexcept nogil:
    """The top-level key's value: 1 when it is a string (unescaped into out,
    *olen its length or -1 if over cap), 2 when it is another value, 0 when
    absent, -1 when the JSON is not an object we can read.  The first of
    duplicate keys."""
    cdef char kbuf[256]
    cdef Py_ssize_t i = _ws(p, 0, n), kl
    if i >= n or p[i] != 123:
        return -1
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 125:
        return 0
    while i < n:
        i = _member_key(p, i, n, kbuf, KEY_MAX, &kl)
        if i < 0:
            return -1
        if kl == klen and memcmp(kbuf, key, klen) == 0:
            if p[i] != 34:
                return 2  # there, not a string
            return 1 if _string(p, i, n, out, cap, olen) >= 0 else -1
        i = _skip(p, i, n)
        if i < 0:
            return -1
        i = _ws(p, i, n)
        if i >= n:
            return -1
        if p[i] == 125:
            return 0
        if p[i] != 44:
            return -1
        i = _ws(p, i + 1, n)
    return -1


def header_string(json, key):
    """json_get_string from Python (tests): the value, None when absent or
    not a string; ValueError for JSON it cannot read."""
    cdef bytes j = bytes(json), k = bytes(key)
    cdef bytearray out = bytearray(SCRATCH)
    cdef Py_ssize_t olen = 0
    cdef int r = json_get_string(<const unsigned char *>PyBytes_AS_STRING(j), len(j),
                                 PyBytes_AS_STRING(k), len(k), <char *>out, SCRATCH, &olen)
    if r < 0:
        raise ValueError("not a JSON object")
    return bytes(out[:olen]) if r == 1 and olen >= 0 else None


# -- the channel's tags, one client's filter and view ---------------------------------------

cdef class TagSet:
    """The tags that the channel's consumers want (IDENTIFY desired_tag), on
    every worker: an untagged consumer leaves a message with one of these
    tags for them (Youzan's dispatch: a tag nobody wants goes to untagged
    consumers)."""

    def __init__(self, tags=()):
        self.set(tags)

    def set(self, tags):
        self.packed = b"".join(bytes(t) + b"\0" for t in sorted(set(tags)) if t)

    def __contains__(self, tag):
        cdef bytes t = bytes(tag)
        return bool(self.has(<const unsigned char *>PyBytes_AS_STRING(t), len(t)))

    cdef bint has(self, const unsigned char *tag, Py_ssize_t n) noexcept:
        cdef const char *p = PyBytes_AS_STRING(self.packed)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(self.packed), i = 0, j
        while i < size:
            j = i
            while p[j] != 0:
                j += 1
            if j - i == n and memcmp(p + i, tag, n) == 0:
                return True
            i = j + 1
        return False


class FilterError(ValueError):
    """An ext_filter Youzan's NewExtFilter refuses (ErrInvalidFilter, a bad
    regexp or glob, ErrNotSupportedFilter)."""


cdef class ExtFilter:
    """IDENTIFY's ext_filter (youzan/nsq nsqd/ext_filter.go NewExtFilter):

        type 1  equal   the header key's string value == filter_data
        type 2  regexp  matches filter_data (POSIX extended, not Go's RE2)
        type 3  glob    matches filter_data (fnmatch(3): * ? [..], no {a,b})
        type 4  multi   filter_data_list of equal filters; filter_ext_key is
                        the relation, "any" or "all"
        inverse         deliver what does not match instead

    A message without JSON headers matches nothing; a key absent or not a
    string reads as "" (regexp, glob)."""

    def __cinit__(self):
        self.regex = NULL

    def __init__(self, int kind, bint inverse=False, key="", data="", data_list=()):
        if not key:
            raise FilterError("invalid filter rule")
        if not data and kind != FILTER_MULTI:
            raise FilterError("invalid filter rule")
        self.kind = kind
        self.inverse = inverse
        self.keys = [key.encode()]
        self.data = [data.encode()]
        if kind == FILTER_REGEXP:
            self.regex = malloc(sizeof(regex_t))
            if regcomp(<regex_t *>self.regex, self.data[0], REG_EXTENDED | REG_NOSUB) != 0:
                free(self.regex)
                self.regex = NULL
                raise FilterError(f"invalid regexp {data!r}")
        elif kind == FILTER_MULTI:
            if key not in ("any", "all") or not data_list:
                raise FilterError("invalid filter rule")
            self.any_of = key == "any"
            self.keys, self.data = [], []
            for item in data_list:
                k, d = item.get("filter_ext_key") or "", item.get("filter_data") or ""
                if not k or not d:
                    raise FilterError("invalid filter rule")
                self.keys.append(k.encode())
                self.data.append(d.encode())
        elif kind not in (FILTER_EQUAL, FILTER_GLOB):
            raise FilterError("the filter type not supported")

    def __dealloc__(self):
        if self.regex != NULL:
            regfree(<regex_t *>self.regex)
            free(self.regex)

    @classmethod
    def from_identify(cls, spec):
        """From youzan.identify's ext_filter dict; None for no filter."""
        if not spec:
            return None
        return cls(spec.get("type", 0), spec.get("inverse", False),
                   spec.get("filter_ext_key", ""), spec.get("filter_data", ""),
                   spec.get("filter_data_list") or ())

    def match(self, json):
        """Whether headers (JSON bytes) match, ignoring inverse (tests)."""
        cdef bytes j = bytes(json)
        cdef bytearray scratch = bytearray(SCRATCH + 1)
        return bool(self.matches(<const unsigned char *>PyBytes_AS_STRING(j), len(j),
                                 <char *>scratch))

    cdef int _equal(self, const unsigned char *json, Py_ssize_t n, bytes key, bytes data,
                    char *scratch) noexcept:
        cdef Py_ssize_t olen = 0
        if json_get_string(json, n, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), scratch,
                           SCRATCH, &olen) != 1:
            return 0
        return olen == PyBytes_GET_SIZE(data) and \
            memcmp(scratch, PyBytes_AS_STRING(data), olen) == 0

    cdef int matches(self, const unsigned char *json, Py_ssize_t n, char *scratch) noexcept:
        cdef Py_ssize_t olen = 0, k
        cdef bytes key = <bytes>self.keys[0]
        cdef int r
        if self.kind == FILTER_EQUAL:
            return self._equal(json, n, key, <bytes>self.data[0], scratch)
        if self.kind == FILTER_MULTI:
            for k in range(len(self.keys)):
                r = self._equal(json, n, <bytes>self.keys[k], <bytes>self.data[k], scratch)
                if r and self.any_of:
                    return 1
                if not r and not self.any_of:
                    return 0
            return 0 if self.any_of else 1
        if json_get_string(json, n, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), scratch,
                           SCRATCH, &olen) != 1 or olen < 0:
            olen = 0
        scratch[olen] = 0
        if self.kind == FILTER_REGEXP:
            return regexec(<regex_t *>self.regex, scratch, 0, NULL, 0) == 0
        return fnmatch(PyBytes_AS_STRING(<bytes>self.data[0]), scratch, 0) == 0


cdef class ExtView:
    """One client's view of an ext topic's messages (see the module doc)."""

    def __cinit__(self):
        self.scratch = <char *>malloc(SCRATCH + 1)
        if self.scratch == NULL:
            raise MemoryError()

    def __init__(self, bint strip=False, ExtFilter filter=None, tag=None, TagSet tags=None,
                 CursorSet cursors=None):
        self.strip = strip
        self.filter = filter
        self.tag = tag.encode() if isinstance(tag, str) else tag
        self.tags = tags
        self.cursors = cursors

    def __dealloc__(self):
        free(self.scratch)

    def accept_record(self, msg):
        """accept() from Python (tests): ACCEPT_SKIP, ACCEPT_DELIVER or ACCEPT_LEAVE."""
        cdef bytes m = bytes(msg)
        return self.accept(PyBytes_AS_STRING(m), len(m))

    cdef int accept(self, const char *msg, uint32_t size) except -1:
        cdef const unsigned char *m = <const unsigned char *>msg
        cdef const unsigned char *json = NULL
        cdef Py_ssize_t n = 0, tlen = 0
        cdef int r
        if self.filter is None and self.tags is None:
            return ACCEPT_DELIVER
        if size >= EXT_OFFSET + 3 and m[EXT_OFFSET] == JSON_HEADER_EXT_VER:
            n = (<Py_ssize_t>m[EXT_OFFSET + 1] << 8) | m[EXT_OFFSET + 2]
            if EXT_OFFSET + 3 + n <= size:
                json = m + EXT_OFFSET + 3
        if self.tags is not None:
            if json != NULL:
                r = json_get_string(json, n, TAG_KEY, len(TAG_KEY), self.scratch, SCRATCH, &tlen)
                if r != 1 or tlen < 0:
                    tlen = 0
            if self.tag is not None and len(self.tag) > 0:
                if tlen != len(self.tag) or memcmp(self.scratch, PyBytes_AS_STRING(self.tag),
                                                   tlen) != 0:
                    return ACCEPT_LEAVE
            elif tlen > 0 and self.tags.has(<const unsigned char *>self.scratch, tlen):
                return ACCEPT_LEAVE
        if self.filter is not None:
            r = 0 if json == NULL else self.filter.matches(json, n, self.scratch)
            if (r != 0) == self.filter.inverse:
                return ACCEPT_SKIP
        return ACCEPT_DELIVER

    cdef int confirm(self, const char *msg_id) except -1:
        """A message skipped by the filter is confirmed for the channel: a log
        channel's cursor marks it (a classic channel has nothing to do)."""
        self.filtered += 1
        if self.cursors is not None and self.cursors.has_id(msg_id):
            self.cursors.finish_id(msg_id)
        return 0


def strip_frames_ext(data):
    """A message frame's data without its ext part (tests)."""
    cdef bytes d = bytes(data)
    cdef Py_ssize_t p = ext_prefix(<const unsigned char *>PyBytes_AS_STRING(d), len(d))
    return d[:EXT_OFFSET] + d[EXT_OFFSET + p:]


# -- publishing to an ext topic ---------------------------------------------------------------

class ExtRecords(bytearray):
    """Packed records whose messages already carry the ext part (PUB_EXT):
    Topic.put_packed stores them as they are."""


def plain_to_ext(packed, Py_ssize_t count, long long max_msg_size, bytes prefix=b"\0"):
    """Packed records ([u32 native size][message])* of plain messages (PUB,
    MPUB, /pub) as ExtRecords of an ext topic's: `prefix`, the ext part
    (ext_body(headers, b""); [0]: no headers), after each header.
    ValueError when a message with it is over max_msg_size."""
    cdef Py_buffer view
    cdef const char *src
    cdef char *dst
    cdef Py_ssize_t pos = 0, k, extra = len(prefix)
    cdef const char *pre = PyBytes_AS_STRING(prefix)
    cdef uint32_t size, grown
    out = ExtRecords()
    PyObject_GetBuffer(packed, &view, PyBUF_SIMPLE)
    try:
        src = <const char *>view.buf
        for k in range(count):  # check first: nothing is converted unless all fit
            if view.len - pos < 4:
                raise ValueError("records end early")
            memcpy(&size, src + pos, 4)
            if size < EXT_OFFSET or view.len - pos - 4 < size:
                raise ValueError("records end early")
            if <long long>size - EXT_OFFSET + extra > max_msg_size:
                raise ValueError(f"message too big for an ext topic "
                                 f"{size - EXT_OFFSET} + {extra} > {max_msg_size}")
            pos += 4 + size
        PyByteArray_Resize(out, pos + count * extra)
        dst = PyByteArray_AS_STRING(out)
        pos = 0
        for k in range(count):
            memcpy(&size, src + pos, 4)
            grown = size + <uint32_t>extra
            memcpy(dst, &grown, 4)
            memcpy(dst + 4, src + pos + 4, EXT_OFFSET)
            memcpy(dst + 4 + EXT_OFFSET, pre, extra)
            memcpy(dst + 4 + EXT_OFFSET + extra, src + pos + 4 + EXT_OFFSET, size - EXT_OFFSET)
            dst += 4 + grown
            pos += 4 + size
    finally:
        PyBuffer_Release(&view)
    return out


def ext_body(headers, body):
    """A PUB_EXT message as an ext topic stores it after the header: version 4,
    the JSON's length and the JSON, then the body (version 0 when headers is None)."""
    if headers is None:
        return b"\0" + bytes(body)
    n = len(headers)
    if n > MAX_HEADER_LENGTH:
        raise ValueError(f"ext json header too long {n} > {MAX_HEADER_LENGTH}")
    return bytes((JSON_HEADER_EXT_VER, n >> 8, n & 0xFF)) + bytes(headers) + bytes(body)


def split_ext(msg):
    """(headers JSON or None, body) of a stored ext message's part after the
    26-byte header (tests, /message/get)."""
    cdef bytes m = bytes(msg)
    if not m:
        return None, m
    if m[0] == NO_EXT_VER:
        return None, m[1:]
    n = (m[1] << 8) | m[2]
    return m[3:3 + n], m[3 + n:]


# -- PUB_EXT and MPUB_EXT in C: the path of valid commands -----------------------------------

cdef Py_ssize_t _literal(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                         const char *word, Py_ssize_t k) noexcept nogil:
    if n - i < k or memcmp(p + i, word, k) != 0:
        return -1
    return i + k


cdef Py_ssize_t _number(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?"""
    cdef Py_ssize_t start
    if i < n and p[i] == 45:
        i += 1
    if i >= n:
        return -1
    if p[i] == 48:
        i += 1
    elif 49 <= p[i] <= 57:
        while i < n and 48 <= p[i] <= 57:
            i += 1
    else:
        return -1
    if i < n and p[i] == 46:
        i += 1
        start = i
        while i < n and 48 <= p[i] <= 57:
            i += 1
        if i == start:
            return -1
    if i < n and (p[i] == 101 or p[i] == 69):
        i += 1
        if i < n and (p[i] == 43 or p[i] == 45):
            i += 1
        start = i
        while i < n and 48 <= p[i] <= 57:
            i += 1
        if i == start:
            return -1
    return i


cdef Py_ssize_t _value(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                       int depth) noexcept nogil:
    """Past one JSON value at p[i] (whitespace before it skipped), or -1."""
    cdef Py_ssize_t unused
    cdef unsigned char c
    i = _ws(p, i, n)
    if i >= n or depth > 1000:
        return -1
    c = p[i]
    if c == 34:
        return _string(p, i, n, NULL, 0, &unused)
    if c == 123 or c == 91:  # { [
        i = _ws(p, i + 1, n)
        if i < n and p[i] == c + 2:  # } or ]
            return i + 1
        while True:
            if c == 123:
                if i >= n or p[i] != 34:
                    return -1
                i = _string(p, i, n, NULL, 0, &unused)
                if i < 0:
                    return -1
                i = _ws(p, i, n)
                if i >= n or p[i] != 58:
                    return -1
                i += 1
            i = _value(p, i, n, depth + 1)
            if i < 0:
                return -1
            i = _ws(p, i, n)
            if i >= n:
                return -1
            if p[i] == c + 2:
                return i + 1
            if p[i] != 44:
                return -1
            i = _ws(p, i + 1, n)
    if c == 116:
        return _literal(p, i, n, "true", 4)
    if c == 102:
        return _literal(p, i, n, "false", 5)
    if c == 110:
        return _literal(p, i, n, "null", 4)
    return _number(p, i, n)


cdef bint json_object(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """Whether p is one JSON object and nothing else (what Youzan's parse takes)."""
    cdef Py_ssize_t i = _ws(p, 0, n)
    if i >= n or p[i] != 123:
        return False
    i = _value(p, i, n, 0)
    return i >= 0 and _ws(p, i, n) == n


cdef int _decimal(const char *text, Py_ssize_t n, uint64_t limit,
                  uint64_t *value) noexcept nogil:
    """text[:n] as an unsigned decimal of at most `limit`: 1, or -1 for anything
    else (empty, another character, past the limit)."""
    cdef Py_ssize_t k
    cdef uint64_t v = 0, d
    if n <= 0:
        return -1
    for k in range(n):
        if not 48 <= text[k] <= 57:
            return -1
        d = <uint64_t>(text[k] - 48)
        if v > (limit - d) // 10:
            return -1
        v = v * 10 + d
    value[0] = v
    return 1


cdef int _decimal_header(const unsigned char *json, Py_ssize_t n, const char *key,
                         Py_ssize_t key_len, Py_ssize_t max_digits, uint64_t limit,
                         char *scratch, uint64_t *value) noexcept nogil:
    """A reserved header whose value is a JSON string of decimal digits: 0
    absent, 1 valid (at most max_digits digits, at most limit), -1 anything else."""
    cdef Py_ssize_t olen = 0
    cdef int r = json_get_string(json, n, key, key_len, scratch, 32, &olen)
    if r == 0:
        return 0
    if r != 1 or olen > max_digits:
        return -1
    return _decimal(scratch, olen, limit, value)


cdef inline int _trace_id(const unsigned char *json, Py_ssize_t n, char *scratch,
                          uint64_t *trace_id) noexcept nogil:
    """The ##trace_id header (Go's ParseUint of a uint64)."""
    return _decimal_header(json, n, "##trace_id", 10, 20, 0xFFFFFFFFFFFFFFFFULL, scratch,
                           trace_id)


cdef inline int _ttl_ms(const unsigned char *json, Py_ssize_t n, char *scratch,
                        uint64_t *ttl_ms) noexcept nogil:
    """The ##ttl_ms header (nsqd/policies/message_ttl.py): at most 15 digits, at most TTL_MS_MAX."""
    return _decimal_header(json, n, "##ttl_ms", 8, 15, TTL_MS_MAX, scratch, ttl_ms)


def header_ttl_ms(json):
    """The ##ttl_ms header of an ext message's JSON headers: None when absent,
    the milliseconds (0: no time to live), ValueError when not valid."""
    cdef bytes j = bytes(json)
    cdef char scratch[32]
    cdef uint64_t ms = 0
    cdef int r = _ttl_ms(<const unsigned char *>PyBytes_AS_STRING(j), len(j), scratch, &ms)
    if r < 0:
        raise ValueError("invalid ##ttl_ms")
    return ms if r == 1 else None


def pack_pub_ext(body, IdGenerator ids, uint64_t timestamp, bint mpub, long long max_msg_size,
                 long long max_body_size, Py_ssize_t max_header, bytearray out,
                 bint ttl_allowed=True):
    """PUB_EXT's ([2 BE n][n JSON][body]) or MPUB_EXT's ([4 BE count]([4 BE size]
    [2 BE n][JSON][body])*) body to an ext topic, as packed ext records
    appended to out, when every message is valid: (count, trace IDs or None, the
    first message's trace ID was given).  None when anything is not (nothing is
    appended): the caller then runs Youzan's parser (youzan/bodies.py) for its
    exact error.  Headers are checked as one JSON object, ##trace_id as Go's
    ParseUint of a string, in C: no Python object per message.

    A ##ttl_ms header (nsqd/policies/message_ttl.py) gives the message a deadline of
    timestamp + ttl: 8 bytes after the body and the attempts field's top bit
    (includes/message_expiry.h); ttl_allowed False (a log topic) or a bad
    value makes the body invalid here (the caller answers the error)."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef Py_ssize_t size, pos = 0, count = 1, k, hn, block, total = 0, base
    cdef long long max_messages = (max_body_size - 4) // 5
    cdef uint64_t tid = 0, ttl = 0
    cdef Py_ssize_t extra
    cdef int r
    cdef char msg_id[16]
    cdef char scratch[32]
    cdef char *dst
    cdef bint first_traced = False, any_ttl = False
    cdef list trace_ids = None
    PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
    try:
        p = <const unsigned char *>view.buf
        size = view.len
        if mpub:
            if size < 4:
                return None
            count = <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) |
                              (<uint32_t>p[2] << 8) | p[3])
            if count <= 0 or count > max_messages:
                return None
            pos = 4
        # pass 1: check every message, size the output
        for k in range(count):
            if mpub:
                if size - pos < 4:
                    return None
                block = <int32_t>((<uint32_t>p[pos] << 24) | (<uint32_t>p[pos + 1] << 16) |
                                  (<uint32_t>p[pos + 2] << 8) | p[pos + 3])
                pos += 4
                if block <= 0 or block > max_msg_size or size - pos < block:
                    return None
            else:
                block = size
            if block <= 2:
                return None
            hn = (<Py_ssize_t>p[pos] << 8) | p[pos + 1]
            if block <= 2 + hn or hn > max_header or block + 1 > max_msg_size:
                return None
            if hn > 0 or not mpub:
                if not json_object(p + pos + 2, hn):
                    return None
                r = _trace_id(p + pos + 2, hn, scratch, &tid)
                if r < 0:
                    return None
                if r == 1:
                    if trace_ids is None:
                        trace_ids = [0] * count
                    trace_ids[k] = tid
                    if k == 0:
                        first_traced = True
                ttl = 0
                r = _ttl_ms(p + pos + 2, hn, scratch, &ttl)
                if r < 0 or (ttl and not ttl_allowed):
                    return None
                if ttl:
                    if block + 1 + NSQSHM_EXPIRY_SIZE > max_msg_size:
                        return None
                    total += NSQSHM_EXPIRY_SIZE
                    any_ttl = True
            total += 4 + EXT_OFFSET + 1 + block - (2 if hn == 0 else 0)
            pos += block
        # pass 2: the records
        base = PyByteArray_GET_SIZE(out)
        PyByteArray_Resize(out, base + total)
        dst = PyByteArray_AS_STRING(out) + base
        pos = 4 if mpub else 0
        for k in range(count):
            block = size
            if mpub:
                block = <int32_t>((<uint32_t>p[pos] << 24) | (<uint32_t>p[pos + 1] << 16) |
                                  (<uint32_t>p[pos + 2] << 8) | p[pos + 3])
                pos += 4
            hn = (<Py_ssize_t>p[pos] << 8) | p[pos + 1]
            ids.next_raw(msg_id)
            if hn == 0:  # MPUB_EXT's message without headers: version 0, the body
                (<uint32_t *>dst)[0] = <uint32_t>(EXT_OFFSET + 1 + block - 2)
                put_message_header(dst + 4, timestamp, 0, msg_id)
                dst[4 + EXT_OFFSET] = NO_EXT_VER
                memcpy(dst + 5 + EXT_OFFSET, p + pos + 2, block - 2)
                dst += 4 + EXT_OFFSET + 1 + block - 2
            else:  # version 4, then [2 BE n][JSON][body] as sent (and a deadline)
                ttl = 0
                if any_ttl:  # (checked in pass 1)
                    _ttl_ms(p + pos + 2, hn, scratch, &ttl)
                extra = NSQSHM_EXPIRY_SIZE if ttl else 0
                (<uint32_t *>dst)[0] = <uint32_t>(EXT_OFFSET + 1 + block + extra)
                put_message_header(dst + 4, timestamp, 0, msg_id)
                dst[4 + EXT_OFFSET] = JSON_HEADER_EXT_VER
                memcpy(dst + 5 + EXT_OFFSET, p + pos, block)
                if ttl:
                    dst[4 + 8] = <char>((<unsigned char>dst[4 + 8]) | NSQSHM_EXPIRY_BIT)
                    nsqshm_put_be64(dst + 5 + EXT_OFFSET + block,
                                    timestamp + ttl * <uint64_t>1000000)
                dst += 4 + EXT_OFFSET + 1 + block + extra
            pos += block
    finally:
        PyBuffer_Release(&view)
    return count, trace_ids, first_traced
