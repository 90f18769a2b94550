"""nsqshm.nsqd.options: flags, config file, validation (nsqd 1.3 behaviour)."""

import pytest

from nsqshm.nsqd import options as o
from nsqshm.nsqd.options import OptionsError, parse_args, parse_duration

# nsqd 1.3 flag names (apps/nsqd/options.go), see notes/nsqd-reference.md section 5
NSQD_FLAGS = {
    "version", "config", "log-level", "log-prefix", "verbose", "node-id", "worker-id",
    "https-address", "http-address", "tcp-address", "auth-http-address", "broadcast-address",
    "broadcast-tcp-port", "broadcast-http-port", "lookupd-tcp-address",
    "http-client-connect-timeout", "http-client-request-timeout", "data-path", "mem-queue-size",
    "max-bytes-per-file", "sync-every", "sync-timeout", "queue-scan-worker-pool-max",
    "queue-scan-selection-count", "msg-timeout", "max-msg-timeout", "max-msg-size",
    "max-req-timeout", "max-body-size", "max-heartbeat-interval", "max-rdy-count",
    "max-output-buffer-size", "max-output-buffer-timeout", "min-output-buffer-timeout",
    "output-buffer-timeout", "max-channel-consumers", "statsd-address", "statsd-interval",
    "statsd-mem-stats", "statsd-prefix", "statsd-udp-packet-size", "statsd-exclude-ephemeral",
    "e2e-processing-latency-percentile", "e2e-processing-latency-window-time", "tls-cert",
    "tls-key", "tls-client-auth-policy", "tls-root-ca-file", "tls-required", "tls-min-version",
    "deflate", "max-deflate-level", "snappy",
    "auth-http-request-method",  # nsqd master, after 1.3.0
}
EXTENSIONS = {"workers", "graceful-timeout", "shm-prefix", "client-timeout", "queue-scan-interval",
              "queue-scan-dirty-percent", "lookupd-ping-interval", "max-queue-depth",
              "max-queue-bytes",
              "queue-overflow", "consumer-read-delay", "cluster-lease-ttl"}
YOUZAN_FLAGS = {"cluster-id", "cluster-leadership-addresses", "rpc-port"}  # cluster mode


def parse(*argv):
    return parse_args(list(argv))


# --------------------------------------------------------------------------
# the table


def test_table_covers_every_nsqd_flag_once():
    names = [f.name for f in o.FLAGS]
    assert len(names) == len(set(names))
    assert set(names) == NSQD_FLAGS | EXTENSIONS | YOUZAN_FLAGS
    assert {f.name for f in o.FLAGS if f.extension} == EXTENSIONS
    for f in o.FLAGS:
        assert f.attr == f.name.replace("-", "_")
        assert f.help
        assert f.help.startswith("[nsqshm extension]") == f.extension


def test_defaults_has_every_attribute():
    d = o.defaults()
    for f in o.FLAGS:
        assert hasattr(d, f.attr)
    assert d.explicit == set() and d.from_config == set() and d.warnings == []


# defaults as nsqd.NewOptions() / nsqdFlagSet() set them (reference section 5)
DEFAULTS = [
    ("tcp_address", "0.0.0.0:4150"),
    ("http_address", "0.0.0.0:4151"),
    ("https_address", "0.0.0.0:4152"),
    ("data_path", ""),
    ("log_level", "info"),
    ("log_prefix", "[nsqd] "),
    ("verbose", False),
    ("version", False),
    ("config", ""),
    ("worker_id", False),
    ("auth_http_address", []),
    ("auth_http_request_method", "get"),
    ("lookupd_tcp_address", []),
    ("broadcast_tcp_port", 0),
    ("broadcast_http_port", 0),
    ("http_client_connect_timeout", 2.0),
    ("http_client_request_timeout", 5.0),
    ("mem_queue_size", 10000),
    ("max_bytes_per_file", 104857600),
    ("sync_every", 2500),
    ("sync_timeout", 2.0),
    ("queue_scan_worker_pool_max", 4),
    ("queue_scan_selection_count", 20),
    ("msg_timeout", 60.0),
    ("max_msg_timeout", 15 * 60.0),
    ("max_msg_size", 1048576),
    ("max_req_timeout", 3600.0),
    ("max_body_size", 5242880),
    ("max_heartbeat_interval", 60.0),
    ("max_rdy_count", 2500),
    ("max_output_buffer_size", 65536),
    ("max_output_buffer_timeout", 30.0),
    ("min_output_buffer_timeout", 0.025),
    ("output_buffer_timeout", 0.25),
    ("max_channel_consumers", 0),
    ("statsd_address", ""),
    ("statsd_interval", 60.0),
    ("statsd_mem_stats", True),
    ("statsd_prefix", "nsq.%s"),
    ("statsd_udp_packet_size", 508),
    ("statsd_exclude_ephemeral", False),
    ("e2e_processing_latency_percentile", []),
    ("e2e_processing_latency_window_time", 600.0),
    ("tls_cert", ""),
    ("tls_key", ""),
    ("tls_client_auth_policy", ""),
    ("tls_root_ca_file", ""),
    ("tls_required", 0),
    ("tls_min_version", 0x0301),
    ("deflate", True),
    ("max_deflate_level", 6),
    ("snappy", True),
    # fixed nsqd options, exposed as nsqshm extensions
    ("client_timeout", 60.0),
    ("queue_scan_interval", 0.1),
    ("queue_scan_dirty_percent", 0.25),
    ("lookupd_ping_interval", 15.0),
    ("workers", 0),
    ("graceful_timeout", 30.0),
    ("shm_prefix", ""),
    ("max_queue_depth", 0),
    ("max_queue_bytes", 0),
    ("queue_overflow", "reject"),
    ("consumer_read_delay", 0.001),
    # youzan/nsq's cluster mode (standalone by default)
    ("cluster_id", "nsq-test-cluster"),
    ("cluster_leadership_addresses", ""),
    ("rpc_port", ""),
    ("cluster_lease_ttl", 6.0),
]


@pytest.mark.parametrize("attr,expected", DEFAULTS, ids=[a for a, _ in DEFAULTS])
def test_default(attr, expected):
    assert getattr(o.defaults(), attr) == expected
    assert getattr(parse(), attr) == expected


def test_defaults_table_is_complete():
    assert {a for a, _ in DEFAULTS} | {"node_id", "broadcast_address"} == {
        f.attr for f in o.FLAGS}


def test_host_derived_defaults():
    import hashlib
    import socket
    import zlib

    host = socket.gethostname()
    d = o.defaults()
    assert d.broadcast_address == host
    assert d.node_id == zlib.crc32(hashlib.md5(host.encode()).digest()) % 1024
    assert 0 <= d.node_id < 1024


def test_defaults_are_independent_copies():
    a = o.defaults()
    a.lookupd_tcp_address.append("x:1")
    assert o.defaults().lookupd_tcp_address == []


# --------------------------------------------------------------------------
# flag forms


@pytest.mark.parametrize("argv", [
    ["-max-rdy-count", "100"],
    ["-max-rdy-count=100"],
    ["--max-rdy-count", "100"],
    ["--max-rdy-count=100"],
])
def test_flag_forms(argv):
    opts = parse_args(argv)
    assert opts.max_rdy_count == 100
    assert opts.explicit == {"max-rdy-count"}


def test_string_flag_forms_and_values():
    assert parse("--tcp-address", "127.0.0.1:0").tcp_address == "127.0.0.1:0"
    assert parse("-tcp-address=127.0.0.1:5000").tcp_address == "127.0.0.1:5000"
    # value containing '=' is kept whole
    assert parse("--log-prefix=a=b").log_prefix == "a=b"
    # an empty value via '='
    assert parse("--log-prefix=").log_prefix == ""
    # like Go, the next argument is the value even when it looks like a flag
    assert parse("--log-prefix", "--snappy").log_prefix == "--snappy"


def test_last_value_wins():
    assert parse("--max-rdy-count=1", "--max-rdy-count=2").max_rdy_count == 2


INT_VALUES = [("10", 10), ("-3", -3), ("+7", 7), ("0x10", 16), ("0o17", 15), ("017", 15),
              ("0b101", 5), ("1_000", 1000), ("0", 0), ("9223372036854775807", 2**63 - 1)]


@pytest.mark.parametrize("text,value", INT_VALUES)
def test_int_values_go_base0(text, value):
    assert parse(f"--sync-every={text}").sync_every == value


BOOL_FORMS = [
    (["--snappy"], True), (["-snappy"], True),
    (["--snappy=false"], False), (["--snappy=true"], True),
    (["--snappy=0"], False), (["--snappy=1"], True),
    (["--snappy=f"], False), (["--snappy=t"], True),
    (["--snappy=F"], False), (["--snappy=T"], True),
    (["--snappy=FALSE"], False), (["--snappy=TRUE"], True),
    (["--snappy=False"], False), (["--snappy=True"], True),
    (["-snappy=false"], False),
]


@pytest.mark.parametrize("argv,value", BOOL_FORMS)
def test_bool_forms(argv, value):
    opts = parse_args(argv)
    assert opts.snappy is value
    assert "snappy" in opts.explicit


def test_bool_never_consumes_next_arg():
    opts = parse("--deflate", "--max-rdy-count", "5")
    assert opts.deflate is True and opts.max_rdy_count == 5
    # "false" is the first non-flag argument: the flags end there, the rest is ignored
    opts = parse("--deflate", "false", "--max-rdy-count", "5")
    assert (opts.deflate, opts.max_rdy_count) == (True, 2500)
    assert opts.ignored_args == ["false", "--max-rdy-count", "5"]


def test_repeatable_flags_accumulate():
    opts = parse("--lookupd-tcp-address=a:4160", "--lookupd-tcp-address", "b:4160",
                 "-auth-http-address=http://x/auth", "--auth-http-address=y:1")
    assert opts.lookupd_tcp_address == ["a:4160", "b:4160"]
    assert opts.auth_http_address == ["http://x/auth", "y:1"]
    # a string-array value is not split on commas (app.StringArray)
    assert parse("--lookupd-tcp-address=a:1,b:2").lookupd_tcp_address == ["a:1,b:2"]


def test_percentiles_repeatable_comma_separated_sorted_descending():
    opts = parse("--e2e-processing-latency-percentile=0.5,0.99",
                 "--e2e-processing-latency-percentile", "1.0",
                 "--e2e-processing-latency-percentile=0.95")
    assert opts.e2e_processing_latency_percentile == [1.0, 0.99, 0.95, 0.5]


# (cluster_lease_ttl is checked in tests/consistence/test_options.py: cluster mode only)
DURATION_FLAGS = [f.attr for f in o.FLAGS if f.kind == o.DURATION and f.attr != "cluster_lease_ttl"]


@pytest.mark.parametrize("attr", DURATION_FLAGS)
def test_every_duration_flag_takes_go_durations(attr):
    opts = parse(f"--{attr.replace('_', '-')}=1m30s")
    assert getattr(opts, attr) == 90.0


def test_log_level_values():
    for text, v in [("debug", "debug"), ("INFO", "info"), ("Warn", "warn"), ("error", "error"),
                    ("fatal", "fatal")]:
        assert parse(f"--log-level={text}").log_level == v


@pytest.mark.parametrize("argv,value", [
    (["--tls-required"], 2), (["--tls-required=true"], 2), (["--tls-required=false"], 0),
    (["--tls-required=tcp-https"], 1), (["--tls-required=TCP-HTTPS"], 1),
    (["--tls-required=1"], 2),
])
def test_tls_required_values(argv, value):
    opts = parse_args(argv + ["--tls-cert=c", "--tls-key=k"])
    assert opts.tls_required == value


@pytest.mark.parametrize("text,value", [
    ("tls1.0", 0x0301), ("tls1.1", 0x0302), ("TLS1.2", 0x0303), ("tls1.3", 0x0304),
    ("", 0x0301),
])
def test_tls_min_version_values(text, value):
    assert parse(f"--tls-min-version={text}").tls_min_version == value


def test_extension_flags():
    opts = parse("--workers=3", "--shm-prefix=/nsq-x", "--client-timeout=10s",
                 "--queue-scan-interval=50ms", "--queue-scan-dirty-percent=0.5")
    assert (opts.workers, opts.shm_prefix, opts.client_timeout, opts.queue_scan_interval,
            opts.queue_scan_dirty_percent) == (3, "/nsq-x", 10.0, 0.05, 0.5)


def test_double_dash_ends_flags():
    assert parse("--snappy=false", "--").snappy is False
    opts = parse("--snappy=false", "--", "--deflate=false")
    assert (opts.snappy, opts.deflate, opts.ignored_args) == (False, True, ["--deflate=false"])


@pytest.mark.parametrize("argv", [["positional"], ["-"], ["--snappy", "--", "extra"]])
def test_arguments_after_the_flags_are_ignored(argv):
    assert parse(*argv).ignored_args == argv[-1:]


def test_version_flag_skips_config_and_validation(tmp_path):
    opts = parse("--version", "--config", str(tmp_path / "missing.toml"),
                 "--max-deflate-level=99")
    assert opts.version is True
    assert parse("-version").version is True
    assert parse().version is False


@pytest.mark.parametrize("flag", ["-h", "--h", "-help", "--help", "--help=1"])
def test_help_prints_usage_and_exits_0(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("--snappy", flag, "--bogus")
    assert exc.value.code == 0
    err = capsys.readouterr().err
    assert err.startswith("Usage of nsqd:\n")
    assert "  -tcp-address string\n" in err


def test_errors_before_help_win():
    with pytest.raises(o.FlagError, match="not defined: -nope"):
        parse("--nope", "--help")


# --------------------------------------------------------------------------
# error messages (Go flag package wording)

ERRORS = [
    (["--foo"], "flag provided but not defined: -foo"),
    (["-foo=1"], "flag provided but not defined: -foo"),
    (["--max-rdy-count", "x"], 'invalid value "x" for flag -max-rdy-count: parse error'),
    (["--max-rdy-count=1.5"], 'invalid value "1.5" for flag -max-rdy-count: parse error'),
    (["--max-rdy-count="], 'invalid value "" for flag -max-rdy-count: parse error'),
    (["--max-rdy-count= 5"], 'invalid value " 5" for flag -max-rdy-count: parse error'),
    (["--max-rdy-count=1__0"], 'invalid value "1__0" for flag -max-rdy-count: parse error'),
    (["--max-rdy-count=08"], 'invalid value "08" for flag -max-rdy-count: parse error'),
    (["--max-rdy-count=9223372036854775808"],
     'invalid value "9223372036854775808" for flag -max-rdy-count: value out of range'),
    (["--msg-timeout=60"], 'invalid value "60" for flag -msg-timeout: parse error'),
    (["--msg-timeout=1x"], 'invalid value "1x" for flag -msg-timeout: parse error'),
    (["--queue-scan-dirty-percent=abc"],
     'invalid value "abc" for flag -queue-scan-dirty-percent: parse error'),
    (["--queue-scan-dirty-percent=1e999"],
     'invalid value "1e999" for flag -queue-scan-dirty-percent: value out of range'),
    (["--e2e-processing-latency-percentile=0.9,x"],
     'invalid value "0.9,x" for flag -e2e-processing-latency-percentile: parse error'),
    (["--log-level=loud"], "invalid value \"loud\" for flag -log-level: invalid log-level 'loud'"),
    (["--tls-min-version=ssl3.0"],
     'invalid value "ssl3.0" for flag -tls-min-version: unknown tlsVersionOption "ssl3.0"'),
    (["--tls-min-version=TLS9"],
     'invalid value "TLS9" for flag -tls-min-version: unknown tlsVersionOption "tls9"'),
    (["--snappy=yes"], 'invalid boolean value "yes" for -snappy: parse error'),
    (["--snappy="], 'invalid boolean value "" for -snappy: parse error'),
    (["--tls-required=Maybe"],
     'invalid boolean value "Maybe" for -tls-required: '
     'strconv.ParseBool: parsing "maybe": invalid syntax'),
    (["--tcp-address"], "flag needs an argument: -tcp-address"),
    (["--snappy", "--lookupd-tcp-address"], "flag needs an argument: -lookupd-tcp-address"),
    (["---tcp-address=x"], "bad flag syntax: ---tcp-address=x"),
    (["-=x"], "bad flag syntax: -=x"),
    (["--log-prefix=a\tb", "--max-rdy-count=\n"],
     'invalid value "\\n" for flag -max-rdy-count: parse error'),
    # validation, as nsqd.New reports it
    (["--max-deflate-level=0"], "--max-deflate-level must be [1,9]"),
    (["--max-deflate-level=10"], "--max-deflate-level must be [1,9]"),
    (["--node-id=1024"], "--node-id must be [0,1024)"),
    (["--node-id=-1"], "--node-id must be [0,1024)"),
    (["--tls-required"], "cannot require TLS client connections without TLS key and cert"),
    (["--tls-client-auth-policy=require"],
     "cannot require TLS client connections without TLS key and cert"),
    (["--tls-cert=c.pem"],
     "failed to build TLS config - --tls-cert and --tls-key must be given together"),
    (["--e2e-processing-latency-percentile=1.5"],
     "invalid E2E processing latency percentile: 1.5"),
    (["--e2e-processing-latency-percentile=0"],
     "invalid E2E processing latency percentile: 0"),
    (["--e2e-processing-latency-percentile=2"],
     "invalid E2E processing latency percentile: 2"),
    # nsqshm sanity checks
    (["--max-msg-size=0"], "--max-msg-size must be > 0"),
    (["--max-body-size=-1"], "--max-body-size must be > 0"),
    (["--max-bytes-per-file=0"], "--max-bytes-per-file must be > 0"),
    (["--max-rdy-count=0"], "--max-rdy-count must be > 0"),
    (["--mem-queue-size=-1"], "--mem-queue-size must be >= 0"),
    (["--workers=-2"], "--workers must be >= 0"),
    (["--consumer-read-delay=-1ms"], "--consumer-read-delay must be >= 0"),
    (["--tcp-address="], "--tcp-address must not be empty"),
    (["--tcp-address=0.0.0.0:65536"],
     '--tcp-address "0.0.0.0:65536": invalid port "65536" (must be 0-65535)'),
    (["--http-address=localhost:http"],
     '--http-address "localhost:http": invalid port "http" (must be 0-65535)'),
    (["--https-address=[::1]:-1"],
     '--https-address "[::1]:-1": invalid port "-1" (must be 0-65535)'),
    (["--broadcast-tcp-port=70000"], "--broadcast-tcp-port must be [0,65535]"),
    (["--broadcast-http-port=-1"], "--broadcast-http-port must be [0,65535]"),
    (["--statsd-address=127.0.0.1:8125", "--statsd-interval=0s"],
     "--statsd-interval must be > 0"),
    (["--lookupd-ping-interval=-1s"], "--lookupd-ping-interval must be > 0"),
    (["--max-queue-depth=-1"], "--max-queue-depth must be >= 0"),
    (["--max-queue-bytes=-1"], "--max-queue-bytes must be >= 0"),
    (["--queue-overflow=block"], "--queue-overflow must be reject or drop-oldest"),
]


@pytest.mark.parametrize("argv,message", ERRORS, ids=[m for _, m in ERRORS])
def test_error_message(argv, message):
    with pytest.raises(OptionsError) as exc:
        parse_args(argv)
    assert str(exc.value) == message
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("argv", [
    ["--tcp-address=/tmp/nsqd.sock"],          # unix socket path (nsqd 1.3)
    ["--tcp-address=[::1]:4150"],
    ["--tcp-address=:4150"],
    ["--tcp-address=127.0.0.1:"],
    ["--tcp-address=127.0.0.1:65535"],
    ["--http-address="],                        # disables the HTTP listener
    ["--https-address="],
    ["--max-channel-consumers=0"],
    ["--e2e-processing-latency-percentile=1.0"],
    ["--tls-client-auth-policy=require", "--tls-cert=c", "--tls-key=k"],
])
def test_valid(argv):
    parse_args(argv)


def test_client_auth_policy_implies_tls_required():
    opts = parse("--tls-client-auth-policy=require-verify", "--tls-cert=c", "--tls-key=k")
    assert opts.tls_required == o.TLS_REQUIRED
    opts = parse("--tls-client-auth-policy=require", "--tls-required=tcp-https",
                 "--tls-cert=c", "--tls-key=k")
    assert opts.tls_required == o.TLS_REQUIRED_EXCEPT_HTTP


@pytest.mark.parametrize("addr,kind", [
    ("0.0.0.0:4150", "tcp"), ("[::]:4150", "tcp"), (":0", "tcp"), ("host:", "tcp"),
    ("/var/run/nsqd.sock", "unix"), ("nsqd.sock", "unix"), ("::1:4150", "unix"),
    ("[::1]4150", "unix"), ("a]:1", "unix"),
])
def test_listen_address_kind(addr, kind):
    assert o.listen_address_kind(addr) == kind


# --------------------------------------------------------------------------
# durations

DURATIONS = [
    ("0", 0.0), ("+0", 0.0), ("-0", 0.0), ("0s", 0.0),
    ("1ns", 1e-9), ("1us", 1e-6), ("1\u00b5s", 1e-6), ("1\u03bcs", 1e-6), ("1ms", 0.001),
    ("250ms", 0.25), ("25ms", 0.025), ("100ms", 0.1), ("1s", 1.0), ("2s", 2.0), ("60s", 60.0),
    ("1m", 60.0), ("1m0s", 60.0), ("15m0s", 900.0), ("10m0s", 600.0), ("2h", 7200.0),
    ("1h0m0s", 3600.0), ("1h30m", 5400.0), ("1.5h", 5400.0), (".5s", 0.5), ("1.s", 1.0),
    ("1.5s", 1.5), ("-1.5s", -1.5), ("+5s", 5.0), ("3h2m1s", 3 * 3600 + 121.0),
    ("1s500ms", 1.5), ("1h1h", 7200.0), ("2562047h", 2562047 * 3600.0),
]


@pytest.mark.parametrize("text,seconds", DURATIONS)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


BAD_DURATIONS = [
    ("", 'time: invalid duration ""'),
    ("-", 'time: invalid duration "-"'),
    ("60", 'time: missing unit in duration "60"'),
    ("1.5", 'time: missing unit in duration "1.5"'),
    ("s", 'time: invalid duration "s"'),
    (".s", 'time: invalid duration ".s"'),
    ("1x", 'time: unknown unit "x" in duration "1x"'),
    ("1 s", 'time: unknown unit " s" in duration "1 s"'),
    ("1S", 'time: unknown unit "S" in duration "1S"'),
    ("1hm", 'time: unknown unit "hm" in duration "1hm"'),
    ("1sec", 'time: unknown unit "sec" in duration "1sec"'),
    (" 1s", 'time: invalid duration " 1s"'),
    ("1d", 'time: unknown unit "d" in duration "1d"'),
    ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
    ("2562048h", 'time: invalid duration "2562048h"'),
]


@pytest.mark.parametrize("text,message", BAD_DURATIONS)
def test_parse_duration_errors(text, message):
    with pytest.raises(ValueError) as exc:
        parse_duration(text)
    assert str(exc.value) == message


@pytest.mark.parametrize("seconds,text", [
    (0, "0s"), (1e-9, "1ns"), (1.5e-6, "1.5\u00b5s"), (0.025, "25ms"), (0.25, "250ms"),
    (1, "1s"), (2.5, "2.5s"), (60, "1m0s"), (90, "1m30s"), (900, "15m0s"), (3600, "1h0m0s"),
    (5400.5, "1h30m0.5s"), (-3, "-3s"),
])
def test_format_duration(seconds, text):
    assert o.format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


# --------------------------------------------------------------------------
# config file


def write(tmp_path, text, name="nsqd.cfg"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_config_values_and_precedence(tmp_path):
    path = write(tmp_path, """
tcp_address = "127.0.0.1:5150"
http_address = "127.0.0.1:5151"
max_rdy_count = 100
mem_queue_size = 7
msg_timeout = "30s"
max_req_timeout = 5000        # integers are milliseconds (go-options)
snappy = false
log_level = "debug"
id = 42
nsqlookupd_tcp_addresses = ["a:4160", "b:4160"]
auth_http_addresses = "x:1,y:2"
e2e_processing_latency_percentiles = [0.99, 1]
tls_min_version = "tls1.2"
queue_scan_dirty_percent = 1
workers = 2
""")
    opts = parse(f"--config={path}", "--max-rdy-count=200", "--lookupd-tcp-address=c:4160")
    assert opts.tcp_address == "127.0.0.1:5150"
    assert opts.http_address == "127.0.0.1:5151"
    assert opts.max_rdy_count == 200              # command line wins
    assert opts.lookupd_tcp_address == ["c:4160"]  # replaces, not appends
    assert opts.mem_queue_size == 7
    assert opts.msg_timeout == 30.0
    assert opts.max_req_timeout == 5.0
    assert opts.snappy is False
    assert opts.log_level == "debug"
    assert opts.node_id == 42
    assert opts.auth_http_address == ["x:1", "y:2"]
    assert opts.e2e_processing_latency_percentile == [0.99, 1.0]
    assert opts.tls_min_version == 0x0303
    assert opts.queue_scan_dirty_percent == 1.0
    assert opts.workers == 2
    assert [w.split(":")[1] for w in opts.warnings] == [
        " flag -queue-scan-dirty-percent is accepted but has no effect"]  # given, so said
    assert opts.from_config == {
        "tcp-address", "http-address", "mem-queue-size", "msg-timeout", "max-req-timeout",
        "snappy", "log-level", "node-id", "auth-http-address",
        "e2e-processing-latency-percentile", "tls-min-version", "queue-scan-dirty-percent",
        "workers"}
    assert opts.explicit == opts.from_config | {"config", "max-rdy-count", "lookupd-tcp-address"}


def test_config_flag_after_other_flags_still_loses_to_them(tmp_path):
    path = write(tmp_path, "max_rdy_count = 100\n")
    assert parse("--max-rdy-count=5", "--config", path).max_rdy_count == 5


@pytest.mark.parametrize("value,expected", [
    ("true", 2), ('"true"', 2), ("false", 0), ('"tcp-https"', 1), ("1", 2),
])
def test_config_tls_required(tmp_path, value, expected):
    path = write(tmp_path, f'tls_required = {value}\ntls_cert = "c"\ntls_key = "k"\n')
    assert parse("--config", path).tls_required == expected


def test_config_empty_tls_min_version_is_dropped(tmp_path):
    path = write(tmp_path, 'tls_min_version = ""\n')
    opts = parse("--config", path)
    assert opts.tls_min_version == 0x0301
    assert "tls-min-version" not in opts.explicit


def test_unknown_config_keys_warn(tmp_path):
    path = write(tmp_path, """
tcp_address = "127.0.0.1:5150"
bogus_option = 1
lookupd_tcp_addresses = ["a:4160"]
lookupd_tcp_address = ["a:4160"]
node_id = 5
verbose = true
tcp-address = "x:1"
""")
    opts = parse("--config", path)
    assert opts.tcp_address == "127.0.0.1:5150"
    assert opts.lookupd_tcp_address == []
    assert opts.warnings == [
        f'WARNING: config file {path}: unknown option "bogus_option" ignored',
        f'WARNING: config file {path}: unknown option "lookupd_tcp_addresses" ignored '
        '(did you mean "nsqlookupd_tcp_addresses"?)',
        f'WARNING: config file {path}: unknown option "lookupd_tcp_address" ignored '
        '(did you mean "nsqlookupd_tcp_addresses"?)',
        f'WARNING: config file {path}: unknown option "node_id" ignored (did you mean "id"?)',
        f'WARNING: config file {path}: unknown option "verbose" ignored '
        "(--verbose can only be given on the command line)",
        f'WARNING: config file {path}: unknown option "tcp-address" ignored '
        '(did you mean "tcp_address"?)',
    ]


def test_config_errors(tmp_path):
    bad = write(tmp_path, "tcp_address = \n", name="bad.toml")
    with pytest.raises(OptionsError) as exc:
        parse("--config", bad)
    msg = str(exc.value)
    assert msg.startswith(f"failed to load config file {bad} - ")
    assert "\n" not in msg

    missing = str(tmp_path / "nope.toml")
    with pytest.raises(OptionsError) as exc:
        parse("--config", missing)
    assert str(exc.value) == (f"failed to load config file {missing} - "
                              f"open {missing}: no such file or directory")


@pytest.mark.parametrize("line,message", [
    ('max_rdy_count = "x"', 'invalid value "x" for max_rdy_count: parse error'),
    ("max_rdy_count = 1.5", "invalid value 1.5 for max_rdy_count: invalid value type float"),
    ('msg_timeout = "60"', 'invalid value "60" for msg_timeout: '
                           'time: missing unit in duration "60"'),
    ("snappy = \"maybe\"", 'invalid value "maybe" for snappy: parse error'),
    ('log_level = "loud"', "invalid value \"loud\" for log_level: invalid log-level 'loud'"),
    ('tls_min_version = "ssl3.0"',
     'invalid value "ssl3.0" for tls_min_version: unknown tlsVersionOption "ssl3.0"'),
    ("nsqlookupd_tcp_addresses = [1, 2]",
     "invalid value [1, 2] for nsqlookupd_tcp_addresses: invalid value type list"),
    ("tcp_address = [\"a\"]", 'invalid value ["a"] for tcp_address: invalid value type list'),
])
def test_config_value_errors(tmp_path, line, message):
    path = write(tmp_path, line + "\n")
    with pytest.raises(OptionsError) as exc:
        parse("--config", path)
    assert str(exc.value) == f"config file {path}: {message}"


def test_config_values_are_validated(tmp_path):
    path = write(tmp_path, "max_deflate_level = 12\n")
    with pytest.raises(OptionsError, match=r"^--max-deflate-level must be \[1,9\]$"):
        parse("--config", path)


# --------------------------------------------------------------------------
# no-effect flags, config dict, usage


def test_no_effect_flags(tmp_path):
    no_effect = {f.name for f in o.FLAGS if f.no_effect}
    assert no_effect == {"verbose", "worker-id", "queue-scan-interval",
                         "queue-scan-selection-count", "queue-scan-worker-pool-max",
                         "queue-scan-dirty-percent"}
    assert parse("--tcp-address=127.0.0.1:0", "--snappy").warnings == []
    path = write(tmp_path, 'queue_scan_interval = "1s"\n')
    opts = parse("--tls-min-version=tls1.2", "--worker-id", "--config", path,
                 "--lookupd-tcp-address=a:1", "--max-rdy-count=3")
    assert [w.split()[2] for w in opts.warnings] == ["-worker-id", "-queue-scan-interval"]


def test_to_config_dict():
    opts = parse("--lookupd-tcp-address=a:1", "--node-id=7", "--log-level=warn")
    cfg = opts.to_config_dict()
    assert cfg["tcp_address"] == "0.0.0.0:4150"
    assert cfg["nsqlookupd_tcp_addresses"] == ["a:1"]
    assert cfg["id"] == 7
    assert cfg["msg_timeout"] == 60.0
    assert cfg["log_level"] == "warn"
    assert cfg["e2e_processing_latency_percentiles"] == []
    for absent in ("version", "config", "verbose", "worker_id", "node_id",
                   "lookupd_tcp_address"):
        assert absent not in cfg
    cfg["nsqlookupd_tcp_addresses"].append("mutated")
    assert opts.lookupd_tcp_address == ["a:1"]
    go = opts.to_config_dict(go_types=True)
    assert go["msg_timeout"] == 60_000_000_000
    assert go["min_output_buffer_timeout"] == 25_000_000
    assert go["log_level"] == 3
    assert go["tls_min_version"] == 769


def test_config_dict_keys_round_trip_through_config_file(tmp_path):
    cfg = parse("--log-level=debug").to_config_dict()
    lines = []
    for k, v in cfg.items():
        if isinstance(v, float) and k not in ("queue_scan_dirty_percent",):
            v = o.format_duration(v)
        lines.append(f"{k} = {_toml(v)}")
    path = write(tmp_path, "\n".join(lines) + "\n")
    opts = parse("--config", path)
    assert [w for w in opts.warnings if "has no effect" not in w] == []
    assert opts.to_config_dict() == cfg


def _toml(v):
    import json
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


def test_usage_lists_every_flag_sorted_go_style():
    text = o.usage()
    assert text.startswith("Usage of nsqd:\n")
    heads = [line for line in text.splitlines() if line.startswith("  -")]
    names = [h.split()[0][1:] for h in heads]
    assert names == sorted(f.name for f in o.FLAGS)
    assert "  -tcp-address string\n    \taddress to listen on for TCP clients" in text
    assert '(default "0.0.0.0:4150")' in text
    assert "  -msg-timeout duration\n    \tdefault duration to wait before auto-requeing a message (default 1m0s)\n" in text
    assert "  -snappy\n    \tenable snappy feature negotiation (client compression) (default true)\n" in text
    assert "  -verbose\n    \t[deprecated] has no effect, use --log-level\n" in text
    assert "  -lookupd-tcp-address value\n" in text
    assert "  -tls-required\n" in text
    assert "  -max-rdy-count int\n    \tmaximum RDY count for a client (default 2500)\n" in text
    assert "(default 25ms)" in text and "(default 1h0m0s)" in text and "(default 15m0s)" in text
    assert "(default INFO)" in text and "(default 769)" in text
    assert "  -workers int\n    \t[nsqshm extension]" in text
    # zero defaults are not shown
    assert "  -data-path string\n    \tpath to store disk-backed messages\n" in text
