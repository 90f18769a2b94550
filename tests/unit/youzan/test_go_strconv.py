"""Go's strconv texts, which Youzan's nsqd puts on the wire (Go src/strconv/atoi.go,
atob.go; e.g. protocol_v2.go E_BAD_PARTITION "topic partition is not valid: %v")."""

import pytest

from nsqshm.youzan import go_strconv as c

SRC = "go src/strconv/atoi.go"

CASES = [
    # (function, input, value or error text, source)
    (c.atoi, "0", 0, SRC),
    (c.atoi, "+7", 7, SRC + " (Atoi fast path: optional sign)"),
    (c.atoi, "-1", -1, SRC),
    (c.atoi, "007", 7, SRC),
    (c.atoi, "", 'strconv.Atoi: parsing "": invalid syntax', SRC),
    (c.atoi, "x", 'strconv.Atoi: parsing "x": invalid syntax', SRC),
    (c.atoi, "-", 'strconv.Atoi: parsing "-": invalid syntax', SRC),
    (c.atoi, " 1", 'strconv.Atoi: parsing " 1": invalid syntax', SRC),
    (c.atoi, "1_0", 'strconv.Atoi: parsing "1_0": invalid syntax', SRC + " (no _ in base 10)"),
    (c.atoi, "9223372036854775807", 9223372036854775807, SRC),
    (c.atoi, "9223372036854775808",
     'strconv.Atoi: parsing "9223372036854775808": value out of range', SRC),
    (c.atoi, "-9223372036854775808", -9223372036854775808, SRC),
    (c.atoi, "99999999999999999999x",
     'strconv.Atoi: parsing "99999999999999999999x": value out of range',
     SRC + " ParseUint: overflow found before the bad byte"),
    (c.atoi, c.text(b"\xff"), 'strconv.Atoi: parsing "\\xff": invalid syntax',
     SRC + " Quote of a wire byte that is not UTF-8"),
    (c.parse_int, "12", 12, SRC),
    (c.parse_int, "1.5", 'strconv.ParseInt: parsing "1.5": invalid syntax', SRC),
    (c.parse_uint, "18446744073709551615", 18446744073709551615, SRC),
    (c.parse_uint, "18446744073709551616",
     'strconv.ParseUint: parsing "18446744073709551616": value out of range', SRC),
    (c.parse_uint, "+1", 'strconv.ParseUint: parsing "+1": invalid syntax', SRC),
    (c.parse_bool, "T", True, "go src/strconv/atob.go"),
    (c.parse_bool, "False", False, "go src/strconv/atob.go"),
    (c.parse_bool, "yes", 'strconv.ParseBool: parsing "yes": invalid syntax',
     "go src/strconv/atob.go"),
]


@pytest.mark.parametrize("fn,arg,expected,src", CASES)
def test_go_strconv(fn, arg, expected, src):
    if isinstance(expected, str):
        with pytest.raises(ValueError) as e:
            fn(arg)
        assert str(e.value) == expected
    else:
        assert fn(arg) == expected
