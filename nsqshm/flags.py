"""Go-style command-line flags and TOML config files, shared by the daemons
(nsqd, nsqlookupd): the generic half of their apps/*/main.go flag sets and
of mreiferson/go-options.

A daemon declares each flag once, as a ``Flag``, and wraps the tuple in a
``FlagSet`` with its own validation.  ``FlagSet.parse_args`` reads the
command line exactly as Go's ``flag`` package (src/flag/flag.go, a FlagSet
made with ExitOnError) does:

- ``-f v``, ``-f=v``, ``--f v``, ``--f=v``; a bool flag takes a value only
  with ``=`` (``-deflate false`` is ``-deflate`` followed by the argument
  ``false``);
- parsing stops at the first argument that is not a flag (``-`` included)
  and after ``--``; the daemons ignore the rest, as nsqd does (a warning
  names them, since ``-deflate false`` leaves deflate on);
- an unknown flag, a missing or bad value: ``FlagError`` (the daemon prints
  its message and the usage to stderr and exits 2); ``-h``/``-help``/
  ``--help`` (unless defined): the usage to stderr and exit 0, as Go's
  ErrHelp under ExitOnError (Go >= 1.15);
- a repeated flag: the last value wins, list flags (StringArray,
  FloatArray) append; values parse as strconv.ParseBool/ParseInt(s, 0, 64)/
  ParseFloat and time.ParseDuration do.

Then the ``--config`` TOML file (keys are the flag name with ``_``, except
the renamed ones given in ``Flag.cfg``), then the daemon's validation.
Precedence is Go's: explicit flag > config file > default.

Values: ints are ``int``, durations are ``float`` seconds, ``log_level`` is
one of ``"debug" "info" "warn" "error" "fatal"``, ``tls_required`` is 0/1/2
and ``tls_min_version`` the TLS protocol number (0x0301 = TLS 1.0, as
``ssl.TLSVersion``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import socket
import sys
import textwrap
import tomllib
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any


class OptionsError(Exception):
    """A bad flag, config file or option value. ``str(err)`` is one line."""


class FlagError(OptionsError):
    """A command line Go's flag package refuses (unknown flag, missing or bad
    value, bad syntax). As flag.ExitOnError does, the daemon prints the message
    and then the usage to stderr, and exits 2."""


# --------------------------------------------------------------------------
# value kinds

BOOL = "bool"
INT = "int"
FLOAT = "float"
DURATION = "duration"
STRING = "string"
STRINGS = "strings"  # repeatable string flag (Go app.StringArray)
FLOATS = "floats"  # repeatable / comma separated floats (Go app.FloatArray)
LOGLEVEL = "loglevel"  # Go lg.LogLevel
TLS_REQUIRED_KIND = "tls-required"  # Go tlsRequiredOption (a bool flag)
TLS_MIN_VERSION_KIND = "tls-min-version"  # Go tlsMinVersionOption

# type names shown by usage(), as Go's flag.UnquoteUsage picks them
_USAGE_TYPE = {
    BOOL: "",
    INT: "int",
    FLOAT: "float",
    DURATION: "duration",
    STRING: "string",
    STRINGS: "value",
    FLOATS: "value",
    LOGLEVEL: "value",
    TLS_REQUIRED_KIND: "",
    TLS_MIN_VERSION_KIND: "value",
}

# the kinds whose Go flag.Value has IsBoolFlag() true
_BOOL_KINDS = (BOOL, TLS_REQUIRED_KIND)

TLS_NOT_REQUIRED = 0
TLS_REQUIRED_EXCEPT_HTTP = 1
TLS_REQUIRED = 2

# accepted --tls-min-version values (nsqd 1.3 has no ssl3.0 despite its help text)
TLS_VERSIONS = {"tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}

# name -> Go lg.LogLevel number
LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}
_LOG_LEVEL_GO_NAMES = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING",
                       "error": "ERROR", "fatal": "FATAL"}

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1



# --------------------------------------------------------------------------
# flags


@functools.cache
def hostname() -> str:
    """os.Hostname(), the default of the --broadcast-address flags."""
    return socket.gethostname()


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag. ``default`` is written as nsqd writes it (durations as Go
    duration strings) or is a zero-argument callable for host-derived ones.
    ``cfg`` is the config-file key when it is not the flag name with ``_``;
    ``None`` means not settable from the config file (as in nsqd)."""

    name: str
    kind: str
    default: Any
    help: str
    cfg: str | None = ""
    extension: bool = False  # an nsqshm-only flag
    # why the flag, though accepted (as the Go daemon accepts it), changes
    # nothing here; the daemon says so at start when the flag is given
    no_effect: str = ""

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")

    @property
    def cfg_name(self) -> str | None:
        if self.cfg is None:
            return None
        return self.cfg or self.attr

    def default_value(self) -> Any:
        d = self.default() if callable(self.default) else self.default
        if self.kind == DURATION:
            return parse_duration(d)
        if isinstance(d, list):
            return list(d)
        return d



class Options(SimpleNamespace):
    """One attribute per flag (``flag.attr``), plus:

    ``explicit``     names of flags set on the command line or in the config file
    ``from_config``  the subset of ``explicit`` that came from the config file
    ``ignored_args`` the arguments after the flags (Go's flagSet.Args()), ignored
    ``warnings``     ready-to-print warning lines (ignored arguments, unknown
                     config keys, flags given that have no effect)

    A daemon subclasses it and its FlagSet sets ``flagset``.
    """

    flagset: FlagSet | None = None
    explicit: set[str]
    from_config: set[str]
    ignored_args: list[str]
    warnings: list[str]

    def to_config_dict(self, *, go_types: bool = False) -> dict[str, Any]:
        """``{cfg_name: value}`` for every config-settable flag, keyed as the
        daemon's config file (and nsqd's ``/config/<opt>``) keys them. With
        ``go_types`` durations are int nanoseconds and log_level the Go level
        number, as the daemons' JSON has them."""
        out: dict[str, Any] = {}
        for f in type(self).flagset.flags:
            if f.cfg_name is None:
                continue
            v = getattr(self, f.attr)
            if isinstance(v, list):
                v = list(v)
            if go_types:
                if f.kind == DURATION:
                    v = round(v * 1e9)
                elif f.kind == LOGLEVEL:
                    v = LOG_LEVELS[v]
            out[f.cfg_name] = v
        return out


# --------------------------------------------------------------------------
# Go value syntax


def _go_quote(s: str) -> str:
    """strconv.Quote (Go's %q)."""
    esc = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f",
           "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    out = ['"']
    for ch in s:
        cp = ord(ch)
        if ch in esc:
            out.append(esc[ch])
        elif 0xDC80 <= cp <= 0xDCFF:  # undecodable argv byte (surrogateescape)
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif cp < 0x80:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)


def _time_quote(s: str) -> str:
    """time package's quote(): non-ASCII and control bytes as \\xNN."""
    out = ['"']
    for ch in s:
        if ord(ch) >= 0x80 or ch < " ":
            out.extend(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape"))
        else:
            if ch in '"\\':
                out.append("\\")
            out.append(ch)
    out.append('"')
    return "".join(out)


def _go_float_v(x: float) -> str:
    """fmt %v of a float64 (close enough: shortest repr, no trailing .0)."""
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if math.isnan(x):
        return "NaN"
    s = repr(x)
    return s[:-2] if s.endswith(".0") else s


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def _parse_bool(s: str) -> bool:
    """strconv.ParseBool."""
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError("parse error")


def _underscore_ok(s: str) -> bool:
    """strconv.underscoreOK."""
    saw = "^"
    i = 0
    if s[:1] in ("-", "+"):
        s = s[1:]
    hexa = False
    if len(s) >= 2 and s[0] == "0" and s[1].lower() in "box":
        i = 2
        saw = "0"
        hexa = s[1].lower() == "x"
    while i < len(s):
        c = s[i]
        if "0" <= c <= "9" or (hexa and "a" <= c.lower() <= "f"):
            saw = "0"
        elif c == "_":
            if saw != "0":
                return False
            saw = "_"
        else:
            if saw == "_":
                return False
            saw = "!"
        i += 1
    return saw != "_"


def _parse_int(s: str, base0: bool = True) -> int:
    """strconv.ParseInt(s, 0, 64) (base0) or ParseInt(s, 10, 64).
    Errors are Go flag's: "parse error" / "value out of range"."""
    body = s[1:] if s[:1] in ("+", "-") else s
    neg = s[:1] == "-"
    base = 10
    digits = body
    if base0:
        low = body[:2].lower()
        if low in ("0x", "0o", "0b"):
            base = {"0x": 16, "0o": 8, "0b": 2}[low]
            digits = body[2:]
        elif len(body) > 1 and body[0] == "0":
            base = 8
            digits = body[1:]
        if "_" in body:
            if not _underscore_ok(s):
                raise ValueError("parse error")
            digits = digits.replace("_", "")
    alphabet = "0123456789abcdef"[:base]
    if not digits or any(c not in alphabet for c in digits.lower()):
        raise ValueError("parse error")
    v = int(digits, base)
    if neg:
        v = -v
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise ValueError("value out of range")
    return v


_FLOAT_RE = re.compile(
    r"[+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
    r"|0[xX](?:[0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?|\.[0-9a-fA-F]+)[pP][+-]?\d+"
    r"|inf|infinity|nan)\Z",
    re.IGNORECASE,
)


def _parse_float(s: str) -> float:
    """strconv.ParseFloat(s, 64), errors as Go flag's."""
    if "_" in s:  # digit separators, where Go's literal syntax allows them ("1_000.5")
        if not _underscore_ok(s):
            raise ValueError("parse error")
        s = s.replace("_", "")
    if not _FLOAT_RE.match(s):
        raise ValueError("parse error")
    body = s.lstrip("+-")
    if body[:2].lower() == "0x":
        v = float.fromhex(s)
    else:
        v = float(s)
    if math.isinf(v) and not body.lower().startswith("inf"):
        raise ValueError("value out of range")
    return v


# --------------------------------------------------------------------------
# durations

_NS = 1
_US = 1000 * _NS
_MS = 1000 * _US
_S = 1000 * _MS
_M = 60 * _S
_H = 60 * _M
_UNITS = {"ns": _NS, "us": _US, "\u00b5s": _US, "\u03bcs": _US, "ms": _MS, "s": _S,
          "m": _M, "h": _H}


def parse_duration_ns(s: str) -> int:
    """time.ParseDuration: int nanoseconds. Raises ValueError with Go's message."""
    orig = s
    bad = f"time: invalid duration {_time_quote(orig)}"
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(bad)
    total = 0
    i, n = 0, len(s)
    while i < n:
        if not (s[i] == "." or "0" <= s[i] <= "9"):
            raise ValueError(bad)
        j = i
        while j < n and "0" <= s[j] <= "9":
            j += 1
        pre = j > i
        whole = int(s[i:j]) if pre else 0
        if whole > 1 << 63:
            raise ValueError(bad)
        frac, scale, post = 0, 1, False
        if j < n and s[j] == ".":
            j += 1
            k = j
            while j < n and "0" <= s[j] <= "9":
                # Go stops accumulating digits once they would overflow
                if frac <= ((1 << 63) - 1 - 9) // 10:
                    frac = frac * 10 + int(s[j])
                    scale *= 10
                j += 1
            post = j > k
        if not pre and not post:
            raise ValueError(bad)
        k = j
        while j < n and not (s[j] == "." or "0" <= s[j] <= "9"):
            j += 1
        if j == k:
            raise ValueError(f"time: missing unit in duration {_time_quote(orig)}")
        u = s[k:j]
        unit = _UNITS.get(u)
        if unit is None:
            raise ValueError(f"time: unknown unit {_time_quote(u)} in duration {_time_quote(orig)}")
        if whole > (1 << 63) // unit:
            raise ValueError(bad)
        v = whole * unit
        if frac:
            v += int(frac * (unit / scale))
            if v > 1 << 63:
                raise ValueError(bad)
        total += v
        if total > 1 << 63:
            raise ValueError(bad)
        i = j
    if neg:
        return -total
    if total > (1 << 63) - 1:
        raise ValueError(bad)
    return total


def parse_duration(s: str) -> float:
    """A Go duration string ("1m0s", "250ms", "1h30m", "1.5h", "0") -> float seconds.
    Units ns, us, µs, ms, s, m, h; a bare number other than 0 is an error, as in Go."""
    return parse_duration_ns(s) / 1e9


def format_duration(seconds: float) -> str:
    """float seconds -> Go's Duration.String() ("1m0s", "250ms", "1h0m0s", "0s")."""
    d = round(seconds * 1e9)
    neg = d < 0
    u = -d if neg else d

    def frac(v: int, prec: int) -> tuple[str, int]:
        digits = f"{v % 10**prec:0{prec}d}".rstrip("0") if prec else ""
        return ("." + digits if digits else ""), v // 10**prec

    if u == 0:
        return "0s"
    if u < _S:
        if u < _US:
            unit, prec = "ns", 0
        elif u < _MS:
            unit, prec = "\u00b5s", 3
        else:
            unit, prec = "ms", 6
        f, u = frac(u, prec)
        out = f"{u}{f}{unit}"
    else:
        f, u = frac(u, 9)
        out = f"{u % 60}{f}s"
        u //= 60
        if u:
            out = f"{u % 60}m{out}"
            u //= 60
            if u:
                out = f"{u}h{out}"
    return "-" + out if neg else out


# --------------------------------------------------------------------------
# addresses


def split_host_port(hostport: str) -> tuple[str, str]:
    """net.SplitHostPort. Raises ValueError when it is not host:port."""
    i = hostport.rfind(":")
    if i < 0:
        raise ValueError("missing port in address")
    j = k = 0
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise ValueError("missing ']' in address")
        if end + 1 == len(hostport):
            raise ValueError("missing port in address")
        if end + 1 != i:
            if hostport[end + 1] == ":":
                raise ValueError("too many colons in address")
            raise ValueError("missing port in address")
        host = hostport[1:end]
        j, k = 1, end + 1
    else:
        host = hostport[:i]
        if ":" in host:
            raise ValueError("too many colons in address")
    if "[" in hostport[j:]:
        raise ValueError("unexpected '[' in address")
    if "]" in hostport[k:]:
        raise ValueError("unexpected ']' in address")
    return host, hostport[i + 1:]


def format_address(address: Any) -> str:
    """An address as Go prints a net.Addr: host:port ([host]:port for IPv6) from a
    socket's (host, port, ...); a unix socket's path as it is, its unnamed peer "@"."""
    if isinstance(address, tuple) and len(address) >= 2:
        host = address[0]
        return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
    return str(address) if address else "@"


def listen_address_kind(addr: str) -> str:
    """nsqd's util.TypeOfAddr: "tcp" for host:port, otherwise "unix" (a socket path)."""
    try:
        split_host_port(addr)
    except ValueError:
        return "unix"
    return "tcp"


def _check_listen_address(flag: str, addr: str) -> None:
    if listen_address_kind(addr) == "unix":
        return
    _, port = split_host_port(addr)
    if port == "":
        return
    if not port.isdigit() or not port.isascii() or int(port) > 65535:
        raise OptionsError(f"--{flag} {_go_quote(addr)}: invalid port {_go_quote(port)} "
                           "(must be 0-65535)")


# --------------------------------------------------------------------------
# setting values


def _set_from_text(flag: Flag, current: Any, text: str) -> Any:
    """The Go flag.Value.Set for this flag: the new value, or ValueError whose
    message is what Go prints after the colon."""
    kind = flag.kind
    if kind == BOOL:
        return _parse_bool(text)
    if kind == INT:
        return _parse_int(text)
    if kind == FLOAT:
        return _parse_float(text)
    if kind == DURATION:
        try:
            return parse_duration(text)
        except ValueError:
            raise ValueError("parse error") from None
    if kind == STRING:
        return text
    if kind == STRINGS:
        return [*current, text]
    if kind == FLOATS:
        vals = [*current, *(_parse_float(p) for p in text.split(","))]
        vals.sort(reverse=True)  # app.FloatArray sorts descending on every Set
        return vals
    if kind == LOGLEVEL:
        low = text.lower()
        if low not in LOG_LEVELS:
            raise ValueError(f"invalid log-level '{text}'")
        return low
    if kind == TLS_REQUIRED_KIND:
        low = text.lower()
        if low == "tcp-https":
            return TLS_REQUIRED_EXCEPT_HTTP
        try:
            return TLS_REQUIRED if _parse_bool(low) else TLS_NOT_REQUIRED
        except ValueError:
            raise ValueError(f"strconv.ParseBool: parsing {_go_quote(low)}: invalid syntax") from None
    if kind == TLS_MIN_VERSION_KIND:
        low = text.lower()
        if low == "":
            return current
        if low not in TLS_VERSIONS:
            raise ValueError(f"unknown tlsVersionOption {_go_quote(low)}")
        return TLS_VERSIONS[low]
    raise AssertionError(kind)  # pragma: no cover


def _toml_repr(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, default=str)


def _coerce_config(flag: Flag, v: Any) -> Any:
    """A config-file value -> the option value (mreiferson/go-options coerce
    rules), or ValueError with a reason."""
    kind = flag.kind
    is_int = isinstance(v, int) and not isinstance(v, bool)
    if kind == BOOL:
        if isinstance(v, bool):
            return v
        if is_int:
            return v != 0
        if isinstance(v, str):
            return _parse_bool(v)
    elif kind == INT:
        if is_int:
            if not _INT64_MIN <= v <= _INT64_MAX:
                raise ValueError("value out of range")
            return v
        if isinstance(v, str):
            return _parse_int(v, base0=False)
    elif kind == FLOAT:
        if isinstance(v, float) or is_int:
            return float(v)
        if isinstance(v, str):
            return _parse_float(v)
    elif kind == DURATION:
        if isinstance(v, str):
            return parse_duration(v)
        if is_int:  # go-options treats integers as milliseconds
            return v / 1e3
    elif kind == STRING:
        if isinstance(v, str):
            return v
        if is_int:
            return str(v)
        if isinstance(v, float):
            return f"{v:f}"
    elif kind == STRINGS:
        if isinstance(v, str):
            return [p for p in v.split(",") if p]
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return list(v)
    elif kind == FLOATS:
        if isinstance(v, str):
            return [_parse_float(p) for p in v.split(",")]
        if isinstance(v, list) and all(
                isinstance(x, float) or (isinstance(x, int) and not isinstance(x, bool))
                for x in v):
            return [float(x) for x in v]
    elif kind == LOGLEVEL:
        if isinstance(v, str):
            return _set_from_text(flag, None, v)
    elif kind == TLS_REQUIRED_KIND:
        # nsqd: t.Set(fmt.Sprintf("%v", v))
        text = ("true" if v else "false") if isinstance(v, bool) else str(v)
        if isinstance(v, (str, int)):
            return _set_from_text(flag, None, text)
    elif kind == TLS_MIN_VERSION_KIND:
        if isinstance(v, str):
            return _set_from_text(flag, None, v)
        if is_int and v in TLS_VERSIONS.values():  # nsqshm: also the number /config shows
            return v
    raise ValueError(f"invalid value type {type(v).__name__}")


# --------------------------------------------------------------------------
# parsing



class FlagSet:
    """A daemon's flags: ``program`` names it in usage ("Usage of nsqd:"),
    ``validate(opts)`` runs its start-up checks (raising OptionsError) after
    the config file is merged, ``options_class`` is its Options subclass."""

    def __init__(self, program: str, flags: Iterable[Flag],
                 validate: Callable[[Options], None] | None = None,
                 options_class: type[Options] = Options) -> None:
        self.program = program
        self.flags: tuple[Flag, ...] = tuple(flags)
        self.by_name: dict[str, Flag] = {f.name: f for f in self.flags}
        assert len(self.by_name) == len(self.flags), "duplicate flag"
        self.by_cfg: dict[str, Flag] = {f.cfg_name: f for f in self.flags if f.cfg_name}
        self.validate = validate
        if options_class.flagset is None:
            options_class.flagset = self
        self.options_class = options_class

    def defaults(self) -> Options:
        """An Options with every flag at its default and nothing explicit."""
        opts = self.options_class(**{f.attr: f.default_value() for f in self.flags})
        opts.explicit = set()
        opts.from_config = set()
        opts.ignored_args = []
        opts.warnings = []
        return opts

    def parse_args(self, argv: list[str]) -> Options:
        """Parse the arguments (without the program name), load ``--config``
        and validate. ``-h``/``--help`` writes usage() to stderr and raises
        SystemExit(0). When ``--version`` is given the config file and
        validation are skipped (the daemons print the version first); the
        caller checks ``options.version``. Raises FlagError for a command
        line Go's flag package refuses, OptionsError for a bad config file or
        value; both one line."""
        cli, cli_names, rest, bare_bool = self._parse_command_line(argv)
        opts = self.defaults()
        for attr, v in cli.items():
            setattr(opts, attr, v)
        opts.explicit.update(cli_names)
        opts.ignored_args = rest
        if rest:
            opts.warnings.append(self._ignored_args_warning(rest, bare_bool))
        if getattr(opts, "version", False):
            return opts
        if getattr(opts, "config", ""):
            cfg, cfg_names, warnings = self._load_config(opts.config)
            opts.warnings.extend(warnings)
            for attr, v in cfg.items():
                if attr not in cli:
                    setattr(opts, attr, v)
            opts.from_config = cfg_names - set(cli_names)
            opts.explicit |= opts.from_config
        if self.validate is not None:
            self.validate(opts)
        opts.warnings.extend(self.no_effect_warnings(opts))
        return opts

    def no_effect_warnings(self, opts: Options) -> list[str]:
        """One line per flag given (command line or config file) that is
        accepted but changes nothing, with the reason, in declaration order."""
        return [f"WARNING: flag -{f.name} is accepted but has no effect: {f.no_effect}"
                for f in self.flags if f.no_effect and f.name in opts.explicit]

    def _ignored_args_warning(self, rest: list[str], bare_bool: str | None) -> str:
        line = (f"WARNING: arguments after the flags are ignored, as {self.program} "
                f"ignores them: {' '.join(_go_quote(a) for a in rest)}")
        if bare_bool is not None:  # "-deflate false": not what it seems
            line += f" (a bool flag takes a value only with '=': -{bare_bool}={rest[0]})"
        return line

    # -- the command line ---------------------------------------------------

    def _parse_command_line(self, argv: list[str]
                            ) -> tuple[dict[str, Any], list[str], list[str], str | None]:
        """Go flag.FlagSet.Parse (parseOne in a loop). Returns ({attr: value},
        names set in order, the arguments left after the flags, the name of
        the bool flag given without a value just before them if any)."""
        values: dict[str, Any] = {}
        seen: list[str] = []
        args = list(argv)
        bare_bool = None
        while args:
            s = args[0]
            if len(s) < 2 or s[0] != "-":
                break  # the first non-flag argument ends the flags
            bare_bool = None
            minuses = 1
            if s[1] == "-":
                minuses = 2
                if len(s) == 2:  # "--" ends the flags
                    args.pop(0)
                    break
            name = s[minuses:]
            if not name or name[0] in "-=":
                raise FlagError(f"bad flag syntax: {s}")
            args.pop(0)
            has_value = False
            value = ""
            eq = name.find("=", 1)  # an "=" cannot be the name's first character
            if eq > 0:
                name, value, has_value = name[:eq], name[eq + 1:], True
            flag = self.by_name.get(name)
            if flag is None:
                if name in ("help", "h"):
                    sys.stderr.write(self.usage())
                    raise SystemExit(0)  # ErrHelp under ExitOnError
                raise FlagError(f"flag provided but not defined: -{name}")
            current = values[flag.attr] if flag.attr in values else flag.default_value()
            if flag.kind in _BOOL_KINDS:  # IsBoolFlag: never takes the next argument
                try:
                    values[flag.attr] = _set_from_text(flag, current,
                                                       value if has_value else "true")
                except ValueError as e:
                    raise FlagError(
                        f"invalid boolean value {_go_quote(value)} for -{name}: {e}") from None
                if not has_value:
                    bare_bool = name
            else:
                if not has_value and args:
                    value, has_value = args.pop(0), True
                if not has_value:
                    raise FlagError(f"flag needs an argument: -{name}")
                try:
                    values[flag.attr] = _set_from_text(flag, current, value)
                except ValueError as e:
                    raise FlagError(
                        f"invalid value {_go_quote(value)} for flag -{name}: {e}") from None
            if name not in seen:
                seen.append(name)
        return values, seen, args, bare_bool

    # -- the config file ----------------------------------------------------

    def _load_config(self, path: str) -> tuple[dict[str, Any], set[str], list[str]]:
        """Read the TOML config: ({attr: value}, flag names set, warnings)."""
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as e:
            reason = e.strerror or str(e)
            raise OptionsError(f"failed to load config file {path} - "
                               f"open {path}: {reason[:1].lower()}{reason[1:]}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            msg = " ".join(str(e).split())
            raise OptionsError(f"failed to load config file {path} - {msg}") from None
        values: dict[str, Any] = {}
        names: set[str] = set()
        warnings: list[str] = []
        for key, v in data.items():
            flag = self.by_cfg.get(key)
            if flag is None:
                warnings.append(self._unknown_key_warning(path, key))
                continue
            try:
                coerced = _coerce_config(flag, v)
            except ValueError as e:
                raise OptionsError(
                    f"config file {path}: invalid value {_toml_repr(v)} for {key}: {e}") from None
            if flag.kind == TLS_MIN_VERSION_KIND and v == "":
                continue  # nsqd drops an empty tls_min_version
            values[flag.attr] = coerced
            names.add(flag.name)
        return values, names, warnings

    def _unknown_key_warning(self, path: str, key: str) -> str:
        line = f'WARNING: config file {path}: unknown option "{key}" ignored'
        hint = None
        flag = self.by_name.get(key.replace("_", "-"))
        if flag is not None:
            hint = flag.cfg_name  # a renamed key, or None: not settable from a file
            if hint is None:
                return line + f" (--{flag.name} can only be given on the command line)"
        else:
            close = difflib.get_close_matches(key, list(self.by_cfg), n=1, cutoff=0.8)
            hint = close[0] if close else None
        return line + (f' (did you mean "{hint}"?)' if hint else "")

    # -- an example config file ------------------------------------------------

    def example_config(self, header: str) -> str:
        """A TOML config file with every option a config file can set, at its
        default, each under its help text, in declaration order (the Go
        daemon's flag order). ``header`` (lines) opens it. Host-derived
        defaults and options with no effect are commented out, with why."""
        out = [f"# {line}".rstrip() for line in header.splitlines()]
        cli_only = [f"--{f.name}" for f in self.flags if f.cfg_name is None]
        out.append(f"# Command-line flags win over this file. Only on the command line: "
                   f"{', '.join(cli_only)}.")
        for flag in self.flags:
            if flag.cfg_name is None:
                continue
            out.append("")
            out.extend(textwrap.wrap(flag.help, 96, initial_indent="# ",
                                     subsequent_indent="# "))
            if callable(flag.default):  # the same file on every machine
                out.append(f"# {flag.cfg_name} =   (default: from this host's name)")
                continue
            line = f"{flag.cfg_name} = {_toml_value(flag)}"
            if flag.no_effect:
                out.extend(textwrap.wrap(f"accepted, no effect: {flag.no_effect}", 96,
                                         initial_indent="# ", subsequent_indent="# "))
                out.append(f"# {line}")
            else:
                out.append(line)
        return "\n".join(out) + "\n"

    # -- usage ----------------------------------------------------------------

    def usage(self) -> str:
        """Go flag usage output: "Usage of <program>:" then every flag sorted by name."""
        out = [f"Usage of {self.program}:\n"]
        for flag in sorted(self.flags, key=lambda f: f.name):
            head = f"  -{flag.name}"
            if _USAGE_TYPE[flag.kind]:
                head += " " + _USAGE_TYPE[flag.kind]
            head += "\t" if len(head) <= 4 else "\n    \t"
            out.append(head + flag.help.replace("\n", "\n    \t") + _default_text(flag) + "\n")
        return "".join(out)


def _toml_value(flag: Flag) -> str:
    """The flag's default written as its config-file value (a duration as Go
    writes it, the log level and TLS options by name)."""
    d = flag.default_value()
    kind = flag.kind
    if kind == DURATION:
        return json.dumps(format_duration(d))
    if kind == TLS_REQUIRED_KIND:
        return {TLS_NOT_REQUIRED: "false", TLS_REQUIRED: "true",
                TLS_REQUIRED_EXCEPT_HTTP: '"tcp-https"'}[d]
    if kind == TLS_MIN_VERSION_KIND:
        return json.dumps({v: k for k, v in TLS_VERSIONS.items()}[d])
    if kind == BOOL:
        return "true" if d else "false"
    if kind == FLOAT:
        return repr(float(d))
    return json.dumps(d)  # ints, strings, lists: JSON's form is TOML's


def _default_text(flag: Flag) -> str:
    """Go PrintDefaults' " (default X)" suffix ("" for zero values)."""
    d = flag.default_value()
    kind = flag.kind
    if kind == STRING:
        return f" (default {_go_quote(d)})" if d else ""
    if kind == BOOL:
        return " (default true)" if d else ""
    if kind in (INT, TLS_REQUIRED_KIND, TLS_MIN_VERSION_KIND):
        return f" (default {d})" if d else ""
    if kind == FLOAT:
        return f" (default {_go_float_v(d)})" if d else ""
    if kind == DURATION:
        return f" (default {format_duration(d)})" if d else ""
    if kind == LOGLEVEL:
        return f" (default {_LOG_LEVEL_GO_NAMES[d]})"
    return ""  # STRINGS / FLOATS start empty


# for the daemons' own validation
check_listen_address = _check_listen_address
go_quote = _go_quote
go_float_v = _go_float_v
