"""nsqadmin command-line flags and config file, compatible with nsqadmin 1.3
(apps/nsqadmin/main.go nsqadminFlagSet, nsqadmin.NewOptions).

Parsing is the shared machinery of ``nsqshm.flags`` (Go ``flag`` syntax, the
``--config`` TOML file keyed by the flag names with ``_`` except the three
renamed list options, explicit flag > config file > default).  ``validate``
runs the checks nsqadmin.New makes before it touches the network, so that a
bad combination is a one-line error (exit 2); resolving addresses and
listening happen at start-up (nsqshm.nsqadmin.nsqadmin).
"""

from __future__ import annotations

import ipaddress
import posixpath

from nsqshm import NSQD_COMPAT_VERSION, __version__, flags
from nsqshm.flags import (
    BOOL,
    DURATION,
    LOGLEVEL,
    STRING,
    STRINGS,
    Flag,
    FlagError,
    FlagSet,
    OptionsError,
    listen_address_kind,
)

__all__ = ["FLAGS", "FLAGSET", "VERSION_STRING", "FlagError", "Options", "OptionsError",
           "normalize_base_path", "parse_args", "parse_cidr", "usage"]

VERSION_STRING = f"nsqadmin v{NSQD_COMPAT_VERSION} (built w/nsqshm-{__version__})"

# the no_effect reasons (said at start when such a flag is given)
_DEPRECATED = "deprecated in nsqadmin, where it has no effect either"
_NO_GRAPHS = ("the pages draw no graphite graphs (nsqadmin's JavaScript app builds its graphite "
              "metric names with it; /api/graphite takes the full target)")

# apps/nsqadmin/main.go order; defaults from nsqadmin.NewOptions()
FLAGS: tuple[Flag, ...] = (
    Flag("config", STRING, "", "path to config file", cfg=None),
    Flag("version", BOOL, False, "print version string", cfg=None),
    Flag("log-level", LOGLEVEL, "info", "set log verbosity: debug, info, warn, error, or fatal"),
    Flag("log-prefix", STRING, "[nsqadmin] ", "log message prefix"),
    Flag("verbose", BOOL, False, "[deprecated] has no effect, use --log-level", cfg=None,
         no_effect=_DEPRECATED),
    Flag("http-address", STRING, "0.0.0.0:4171", "<addr>:<port> to listen on for HTTP clients"),
    Flag("base-path", STRING, "/", "URL base path"),
    Flag("dev-static-dir", STRING, "", "(development use only)"),
    Flag("graphite-url", STRING, "", "graphite HTTP address"),
    Flag("proxy-graphite", BOOL, False, "proxy HTTP requests to graphite"),
    Flag("statsd-counter-format", STRING, "stats.counters.%s.count",
         "The counter stats key formatting applied by the implementation of statsd. "
         "If no formatting is desired, set this to an empty string.", no_effect=_NO_GRAPHS),
    Flag("statsd-gauge-format", STRING, "stats.gauges.%s",
         "The gauge stats key formatting applied by the implementation of statsd. "
         "If no formatting is desired, set this to an empty string.", no_effect=_NO_GRAPHS),
    Flag("statsd-prefix", STRING, "nsq.%s",
         "prefix used for keys sent to statsd (%s for host replacement, must match nsqd)",
         no_effect=_NO_GRAPHS),
    Flag("statsd-interval", DURATION, "1m0s",
         "time interval nsqd is configured to push to statsd (must match nsqd)"),
    Flag("notification-http-endpoint", STRING, "",
         "HTTP endpoint (fully qualified) to which POST notifications of admin actions "
         "will be sent"),
    Flag("http-client-connect-timeout", DURATION, "2s", "timeout for HTTP connect"),
    Flag("http-client-request-timeout", DURATION, "5s", "timeout for HTTP request"),
    Flag("http-client-tls-insecure-skip-verify", BOOL, False,
         "configure the HTTP client to skip verification of TLS certificates"),
    Flag("http-client-tls-root-ca-file", STRING, "", "path to CA file for the HTTP client"),
    Flag("http-client-tls-cert", STRING, "", "path to certificate file for the HTTP client"),
    Flag("http-client-tls-key", STRING, "", "path to key file for the HTTP client"),
    Flag("allow-config-from-cidr", STRING, "127.0.0.1/8",
         "A CIDR from which to allow HTTP requests to the /config endpoint"),
    Flag("acl-http-header", STRING, "X-Forwarded-User",
         "HTTP header to check for authenticated admin users"),
    Flag("lookupd-http-address", STRINGS, [],
         "lookupd HTTP address (may be given multiple times)", cfg="nsqlookupd_http_addresses"),
    Flag("nsqd-http-address", STRINGS, [], "nsqd HTTP address (may be given multiple times)",
         cfg="nsqd_http_addresses"),
    Flag("admin-user", STRINGS, [],
         "admin user (may be given multiple times; if specified, only these users will be able "
         "to perform privileged actions; acl-http-header is used to determine the "
         "authenticated user)", cfg="admin_users"),
)


class Options(flags.Options):
    """nsqadmin's options: one attribute per flag in FLAGS."""


def normalize_base_path(path: str) -> str:
    """nsqadmin's normalizeBasePath: "/" when empty, a leading "/", path.Clean."""
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    return posixpath.normpath(path).replace("//", "/")


def parse_cidr(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """net.ParseCIDR: an address with a prefix length ("127.0.0.1/8"); ValueError otherwise."""
    address, slash, bits = text.partition("/")
    if not slash or not bits.isdigit() or not bits.isascii():
        raise ValueError(f"invalid CIDR address: {text}")
    try:
        return ipaddress.ip_network(f"{address}/{int(bits)}", strict=False)
    except ValueError:
        raise ValueError(f"invalid CIDR address: {text}") from None


def validate(opts: Options) -> None:
    """nsqadmin.New's checks that need no network, as one line each."""
    nsqd, lookupd = opts.nsqd_http_address, opts.lookupd_http_address
    if not nsqd and not lookupd:
        raise OptionsError("--nsqd-http-address or --lookupd-http-address required")
    if nsqd and lookupd:
        raise OptionsError("use --nsqd-http-address or --lookupd-http-address not both")
    if opts.http_client_tls_cert and not opts.http_client_tls_key:
        raise OptionsError("--http-client-tls-key must be specified with --http-client-tls-cert")
    if opts.http_client_tls_key and not opts.http_client_tls_cert:
        raise OptionsError("--http-client-tls-cert must be specified with --http-client-tls-key")
    if opts.allow_config_from_cidr:
        try:
            parse_cidr(opts.allow_config_from_cidr)
        except ValueError as err:
            raise OptionsError(f"failed to parse --allow-config-from-cidr "
                               f"({opts.allow_config_from_cidr}) - {err}") from None
    if opts.proxy_graphite and not opts.graphite_url.startswith(("http://", "https://")):
        raise OptionsError(f"failed to parse --graphite-url ({opts.graphite_url}) - "
                           "an http:// or https:// URL is needed to proxy graphite")
    addr = opts.http_address
    if listen_address_kind(addr) == "unix":  # nsqadmin listens on TCP only
        raise OptionsError(f"--http-address {flags.go_quote(addr)}: missing port in address")
    flags.check_listen_address("http-address", addr)
    opts.base_path = normalize_base_path(opts.base_path)


FLAGSET = FlagSet("nsqadmin", FLAGS, validate=validate, options_class=Options)


def parse_args(argv: list[str]) -> Options:
    """Parse nsqadmin arguments (without the program name); see FlagSet.parse_args."""
    return FLAGSET.parse_args(argv)


def usage() -> str:
    """Go flag usage output: "Usage of nsqadmin:" then every flag sorted by name."""
    return FLAGSET.usage()
