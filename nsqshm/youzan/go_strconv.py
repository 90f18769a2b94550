"""Go's strconv number and bool parsing, with Go's error texts.

Youzan's nsqd puts these texts on the wire (E_BAD_PARTITION "topic partition is not
valid: strconv.Atoi: parsing \"x\": invalid syntax", the /channel/setoffset 400 body, ...),
so they are reproduced byte for byte: Go's src/strconv/atoi.go (ParseUint, ParseInt,
Atoi: base 10, optional sign, digits only, the range checked digit by digit) and
atob.go (ParseBool). Every parser raises ValueError(text).
"""

from nsqshm.nsqd.names import go_quote

_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1


def _num_error(fn, s, what):
    # NumError.Error(): "strconv." + Func + ": parsing " + Quote(Num) + ": " + Err
    return ValueError(f"strconv.{fn}: parsing {go_quote(s)}: {what}")


def _parse_uint(fn, s, orig):
    """ParseUint(s, 10, 64): the first non-digit is a syntax error, the first digit
    that overflows is a range error (whichever comes first, as Go's loop)."""
    if s == "":
        raise _num_error(fn, orig, "invalid syntax")
    n = 0
    for ch in s:
        if not "0" <= ch <= "9":
            raise _num_error(fn, orig, "invalid syntax")
        n = n * 10 + (ord(ch) - 48)
        if n > _UINT64_MAX:
            raise _num_error(fn, orig, "value out of range")
    return n


def parse_uint(s):
    """strconv.ParseUint(s, 10, 64) (a sign is a syntax error)."""
    return _parse_uint("ParseUint", s, s)


def parse_int(s, fn="ParseInt"):
    """strconv.ParseInt(s, 10, 64) (bitSize 0 is 64 on Youzan's amd64 builds)."""
    if s == "":
        raise _num_error(fn, s, "invalid syntax")
    neg = s[0] == "-"
    body = s[1:] if s[0] in "+-" else s
    un = _parse_uint(fn, body, s)
    if (not neg and un > _INT64_MAX) or (neg and un > _INT64_MAX + 1):
        raise _num_error(fn, s, "value out of range")
    return -un if neg else un


def atoi(s):
    """strconv.Atoi(s): ParseInt(s, 10, 0) with Func "Atoi"."""
    return parse_int(s, "Atoi")


_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def parse_bool(s):
    """strconv.ParseBool(s)."""
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise _num_error("ParseBool", s, "invalid syntax")


def text(raw):
    """Wire bytes as the str Go's string(b) makes of them (undecodable bytes kept for
    go_quote through surrogateescape)."""
    if isinstance(raw, str):
        return raw
    return bytes(raw).decode("utf-8", "surrogateescape")
