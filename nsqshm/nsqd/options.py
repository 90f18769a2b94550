"""nsqd command-line flags and config file, compatible with nsqd 1.3.

Every flag is declared once, in ``FLAGS``; the parsing (Go's ``flag``
package and the ``--config`` TOML file, explicit flag > config file >
default) is the shared machinery in ``nsqshm.flags``. ``parse_args`` then
validates as ``nsqd.New`` does.

Values: ints are ``int``, durations are ``float`` seconds, ``log_level`` is
one of ``"debug" "info" "warn" "error" "fatal"``, ``tls_required`` is 0/1/2
(``TLS_NOT_REQUIRED``/``TLS_REQUIRED_EXCEPT_HTTP``/``TLS_REQUIRED``) and
``tls_min_version`` the TLS protocol number (0x0301 = TLS 1.0, as
``ssl.TLSVersion``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import zlib

from nsqshm import flags
from nsqshm.consistence import options as cluster_options
from nsqshm.flags import (
    BOOL,
    DURATION,
    FLOAT,
    FLOATS,
    INT,
    LOG_LEVELS,
    LOGLEVEL,
    STRING,
    STRINGS,
    TLS_MIN_VERSION_KIND,
    TLS_NOT_REQUIRED,
    TLS_REQUIRED,
    TLS_REQUIRED_EXCEPT_HTTP,
    TLS_REQUIRED_KIND,
    TLS_VERSIONS,
    Flag,
    FlagError,
    FlagSet,
    OptionsError,
    check_listen_address,
    format_duration,
    go_float_v,
    hostname,
    listen_address_kind,
    parse_duration,
    parse_duration_ns,
    split_host_port,
)

__all__ = [
    "DURATION",
    "FLAGS",
    "FLAGSET",
    "FLAGS_BY_NAME",
    "LOG_LEVELS",
    "TLS_NOT_REQUIRED",
    "TLS_REQUIRED",
    "TLS_REQUIRED_EXCEPT_HTTP",
    "TLS_VERSIONS",
    "Flag",
    "FlagError",
    "Options",
    "OptionsError",
    "defaults",
    "format_duration",
    "listen_address_kind",
    "parse_args",
    "parse_duration",
    "parse_duration_ns",
    "split_host_port",
    "usage",
    "validate",
]


# --------------------------------------------------------------------------
# the flag table


@functools.cache
def _default_node_id() -> int:
    # nsqd: crc32.ChecksumIEEE(md5(hostname)) % 1024
    return zlib.crc32(hashlib.md5(hostname().encode()).digest()) % 1024


_EXT = "[nsqshm extension] "

# the no_effect reasons (said at start when such a flag is given)
_DEPRECATED = "deprecated in nsqd, where it has no effect either"
_SCAN = ("the in-flight/deferred scan loop sleeps until the earliest deadline of any channel "
         "(it is woken when an earlier one is set)")

# nsqd 1.3, apps/nsqd/options.go nsqdFlagSet() order, defaults from nsqd.NewOptions()
FLAGS: tuple[Flag, ...] = (
    Flag("version", BOOL, False, "print version string", cfg=None),
    Flag("config", STRING, "", "path to config file", cfg=None),
    Flag("log-level", LOGLEVEL, "info", "set log verbosity: debug, info, warn, error, or fatal"),
    Flag("log-prefix", STRING, "[nsqd] ", "log message prefix"),
    Flag("verbose", BOOL, False, "[deprecated] has no effect, use --log-level", cfg=None,
         no_effect=_DEPRECATED),
    Flag("node-id", INT, _default_node_id,
         "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
         cfg="id"),
    Flag("worker-id", BOOL, False, "[deprecated] use --node-id", cfg=None,
         no_effect=_DEPRECATED),
    Flag("https-address", STRING, "0.0.0.0:4152", "<addr>:<port> to listen on for HTTPS clients"),
    Flag("http-address", STRING, "0.0.0.0:4151",
         "address to listen on for HTTP clients (<addr>:<port> for TCP/IP or <path> for unix socket)"),
    Flag("tcp-address", STRING, "0.0.0.0:4150",
         "address to listen on for TCP clients (<addr>:<port> for TCP/IP or <path> for unix socket)"),
    Flag("auth-http-address", STRINGS, [],
         "<addr>:<port> or a full url to query auth server (may be given multiple times)",
         cfg="auth_http_addresses"),
    # nsqd after 1.3.0 (master): how nsqd asks the auth server
    Flag("auth-http-request-method", STRING, "get",
         "HTTP method to use for auth server requests (get or post)"),
    Flag("broadcast-address", STRING, hostname,
         "address that will be registered with lookupd (defaults to the OS hostname)"),
    Flag("broadcast-tcp-port", INT, 0,
         "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd is listening on)"),
    Flag("broadcast-http-port", INT, 0,
         "HTTP port that will be registered with lookupd (defaults to the HTTP port that this nsqd is listening on)"),
    Flag("lookupd-tcp-address", STRINGS, [], "lookupd TCP address (may be given multiple times)",
         cfg="nsqlookupd_tcp_addresses"),
    Flag("http-client-connect-timeout", DURATION, "2s", "timeout for HTTP connect"),
    Flag("http-client-request-timeout", DURATION, "5s", "timeout for HTTP request"),
    # diskqueue options
    Flag("data-path", STRING, "", "path to store disk-backed messages"),
    Flag("mem-queue-size", INT, 10000, "number of messages to keep in memory (per topic/channel)"),
    Flag("max-bytes-per-file", INT, 104857600, "number of bytes per diskqueue file before rolling"),
    Flag("sync-every", INT, 2500, "number of messages per diskqueue fsync"),
    Flag("sync-timeout", DURATION, "2s", "duration of time per diskqueue fsync"),
    Flag("queue-scan-worker-pool-max", INT, 4,
         "max concurrency for checking in-flight and deferred message timeouts",
         no_effect=_SCAN + "; each worker process scans its own channels, so --workers is "
                           "the concurrency"),
    Flag("queue-scan-selection-count", INT, 20,
         "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts",
         no_effect=_SCAN + " and then checks every channel with a message in flight or "
                           "deferred, not a random selection"),
    # msg and command options
    Flag("msg-timeout", DURATION, "1m0s", "default duration to wait before auto-requeing a message"),
    Flag("max-msg-timeout", DURATION, "15m0s", "maximum duration before a message will timeout"),
    Flag("max-msg-size", INT, 1048576, "maximum size of a single message in bytes"),
    Flag("max-req-timeout", DURATION, "1h0m0s", "maximum requeuing timeout for a message"),
    Flag("max-body-size", INT, 5242880, "maximum size of a single command body"),
    # client overridable configuration options
    Flag("max-heartbeat-interval", DURATION, "1m0s",
         "maximum client configurable duration of time between client heartbeats"),
    Flag("max-rdy-count", INT, 2500, "maximum RDY count for a client"),
    Flag("max-output-buffer-size", INT, 65536,
         "maximum client configurable size (in bytes) for a client output buffer"),
    Flag("max-output-buffer-timeout", DURATION, "30s",
         "maximum client configurable duration of time between flushing to a client"),
    Flag("min-output-buffer-timeout", DURATION, "25ms",
         "minimum client configurable duration of time between flushing to a client"),
    Flag("output-buffer-timeout", DURATION, "250ms",
         "default duration of time between flushing data to clients"),
    Flag("consumer-read-delay", DURATION, "1ms",
         _EXT + "longest wait for 8 KiB of a consumer's commands (its FINs read in batches) "
         "while it holds at least 256 messages in flight and its worker publishes nothing "
         "(0 = read at once)", extension=True),
    Flag("max-channel-consumers", INT, 0,
         "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)"),
    # statsd integration options
    Flag("statsd-address", STRING, "", "UDP <addr>:<port> of a statsd daemon for pushing stats"),
    Flag("statsd-interval", DURATION, "1m0s", "duration between pushing to statsd"),
    Flag("statsd-mem-stats", BOOL, True, "toggle sending memory and GC stats to statsd"),
    Flag("statsd-prefix", STRING, "nsq.%s",
         "prefix used for keys sent to statsd (%s for host replacement)"),
    Flag("statsd-udp-packet-size", INT, 508, "the size in bytes of statsd UDP packets"),
    Flag("statsd-exclude-ephemeral", BOOL, False,
         "Skip ephemeral topics and channels when sending stats to statsd"),
    # end to end percentile flags
    Flag("e2e-processing-latency-percentile", FLOATS, [],
         "message processing time percentiles (as float (0, 1.0]) to track (can be specified "
         "multiple times or comma separated '1.0,0.99,0.95', default none)",
         cfg="e2e_processing_latency_percentiles"),
    Flag("e2e-processing-latency-window-time", DURATION, "10m0s",
         "calculate end to end latency quantiles for this duration of time (ie: 60s would only "
         "show quantile calculations from the past 60 seconds)"),
    # TLS config
    Flag("tls-cert", STRING, "", "path to certificate file"),
    Flag("tls-key", STRING, "", "path to key file"),
    Flag("tls-client-auth-policy", STRING, "",
         "client certificate auth policy ('require' or 'require-verify')"),
    Flag("tls-root-ca-file", STRING, "", "path to certificate authority file"),
    Flag("tls-required", TLS_REQUIRED_KIND, TLS_NOT_REQUIRED,
         "require TLS for client connections (true, false, tcp-https)"),
    Flag("tls-min-version", TLS_MIN_VERSION_KIND, TLS_VERSIONS["tls1.0"],
         "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')"),
    # compression
    Flag("deflate", BOOL, True, "enable deflate feature negotiation (client compression)"),
    Flag("max-deflate-level", INT, 6,
         "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)"),
    Flag("snappy", BOOL, True, "enable snappy feature negotiation (client compression)"),
    # nsqshm extensions. The last three are fixed (non-flag) nsqd options.
    Flag("workers", INT, 0, _EXT + "number of worker processes (0 = number of CPU cores)",
         extension=True),
    Flag("graceful-timeout", DURATION, "30s",
         _EXT + "how long workers may take to stop before they are SIGKILLed", extension=True),
    Flag("shm-prefix", STRING, "",
         _EXT + "name prefix for shared-memory segments (default derived from --data-path)",
         extension=True),
    Flag("client-timeout", DURATION, "1m0s",
         _EXT + "idle client timeout; the default heartbeat interval is half of it (fixed in nsqd)",
         extension=True),
    Flag("queue-scan-interval", DURATION, "100ms",
         _EXT + "interval between in-flight/deferred timeout scans (fixed in nsqd)",
         extension=True, no_effect=_SCAN + " instead of waking every interval"),
    Flag("queue-scan-dirty-percent", FLOAT, 0.25,
         _EXT + "fraction of dirty channels in a scan above which it repeats at once (fixed in nsqd)",
         extension=True,
         no_effect=_SCAN + " and then checks every channel, so no sample is ever repeated"),
    Flag("lookupd-ping-interval", DURATION, "15s",
         _EXT + "interval between PINGs to each nsqlookupd (fixed in nsqd)", extension=True),
    Flag("max-queue-depth", INT, 0,
         _EXT + "max depth, in messages, of each new topic and channel (0 = unbounded; "
         "/topic/policy and /channel/policy set each)", extension=True),
    Flag("max-queue-bytes", INT, 0,
         _EXT + "max bytes of messages (26 + body each) of each new topic and channel "
         "(0 = unbounded; /topic/policy and /channel/policy set each)", extension=True),
    Flag("queue-overflow", STRING, "reject",
         _EXT + "what a full bounded queue does: reject (the publish fails) or drop-oldest",
         extension=True),
) + cluster_options.NSQD  # youzan/nsq's cluster mode (consistence/options.py)

FLAGS_BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}
assert len(FLAGS_BY_NAME) == len(FLAGS), "duplicate flag"

class Options(flags.Options):
    """nsqd's options: one attribute per flag in FLAGS (see nsqshm.flags.Options)."""


def validate(opts: Options) -> None:
    """nsqd's startup checks (nsqd.New) plus sanity checks nsqshm relies on.
    May adjust tls_required as nsqd does. Raises OptionsError."""
    if not 1 <= opts.max_deflate_level <= 9:
        raise OptionsError("--max-deflate-level must be [1,9]")
    if not 0 <= opts.node_id < 1024:
        raise OptionsError("--node-id must be [0,1024)")
    if opts.tls_client_auth_policy and opts.tls_required == TLS_NOT_REQUIRED:
        opts.tls_required = TLS_REQUIRED
    if bool(opts.tls_cert) != bool(opts.tls_key):
        raise OptionsError("failed to build TLS config - --tls-cert and --tls-key must be given together")
    if opts.tls_required != TLS_NOT_REQUIRED and not opts.tls_cert:
        raise OptionsError("cannot require TLS client connections without TLS key and cert")
    if opts.auth_http_request_method not in ("post", "get"):
        raise OptionsError("--auth-http-request-method must be post or get")
    for p in opts.e2e_processing_latency_percentile:
        if not 0 < p <= 1:
            raise OptionsError(f"invalid E2E processing latency percentile: {go_float_v(p)}")
    for name in ("max-msg-size", "max-body-size", "max-bytes-per-file", "max-rdy-count"):
        if getattr(opts, name.replace("-", "_")) <= 0:
            raise OptionsError(f"--{name} must be > 0")
    for name in ("mem-queue-size", "max-output-buffer-size", "max-channel-consumers", "workers",
                 "queue-scan-selection-count", "queue-scan-worker-pool-max",
                 "consumer-read-delay"):
        if getattr(opts, name.replace("-", "_")) < 0:
            raise OptionsError(f"--{name} must be >= 0")
    if not opts.tcp_address:
        raise OptionsError("--tcp-address must not be empty")
    for name in ("tcp-address", "http-address", "https-address"):
        addr = getattr(opts, name.replace("-", "_"))
        if addr:  # an empty http(s) address disables that listener
            check_listen_address(name, addr)
    for name in ("broadcast-tcp-port", "broadcast-http-port"):
        if not 0 <= getattr(opts, name.replace("-", "_")) <= 65535:
            raise OptionsError(f"--{name} must be [0,65535]")
    if opts.statsd_address and opts.statsd_interval <= 0:
        raise OptionsError("--statsd-interval must be > 0")  # nsqd's ticker would panic
    if opts.lookupd_ping_interval <= 0:
        raise OptionsError("--lookupd-ping-interval must be > 0")
    if opts.max_queue_depth < 0:
        raise OptionsError("--max-queue-depth must be >= 0")
    if opts.max_queue_bytes < 0:
        raise OptionsError("--max-queue-bytes must be >= 0")
    if opts.queue_overflow not in ("reject", "drop-oldest"):
        raise OptionsError("--queue-overflow must be reject or drop-oldest")
    cluster_options.validate(opts, workers=opts.workers or os.cpu_count() or 1)


FLAGSET = FlagSet("nsqd", FLAGS, validate=validate, options_class=Options)


def defaults() -> Options:
    """An Options with every flag at its nsqd default and nothing explicit."""
    return FLAGSET.defaults()


def parse_args(argv: list[str]) -> Options:
    """Parse nsqd arguments (without the program name), load ``--config`` and
    validate. ``-h``/``--help`` writes usage() to stderr and raises SystemExit(0).
    When ``--version`` is given the config file and validation are skipped (nsqd
    prints the version first); the caller checks ``options.version``.
    Raises FlagError (the command line) or OptionsError (config file, values),
    one line."""
    return FLAGSET.parse_args(argv)


def usage() -> str:
    """Go flag usage output: "Usage of nsqd:" then every flag sorted by name."""
    return FLAGSET.usage()
