"""Go's flag package semantics (src/flag/flag.go, ExitOnError) for the three
daemons' command lines: argv -> options, or exit code and stderr.

The daemons' main() returns the exit code of a refused command line before
it starts anything, and -h raises SystemExit(0) as Go's os.Exit(0), so most
rows run in-process; a few rows run the real `nsqshm` command for the exit
codes a shell sees."""

import subprocess
import sys

import pytest

from nsqshm.nsqadmin import main as admin_main
from nsqshm.nsqadmin import options as admin_options
from nsqshm.nsqd import main as nsqd_main
from nsqshm.nsqd import options as nsqd_options
from nsqshm.nsqlookupd import main as lookupd_main
from nsqshm.nsqlookupd import options as lookupd_options

# daemon -> (options module, main module, `nsqshm` subcommand, argv every row starts with)
DAEMONS = {
    "nsqd": (nsqd_options, nsqd_main, "start", []),
    "nsqlookupd": (lookupd_options, lookupd_main, "lookupd", []),
    # nsqadmin refuses to start without an nsqd or lookupd address
    "nsqadmin": (admin_options, admin_main, "admin", ["-nsqd-http-address", "127.0.0.1:4151"]),
}

# --------------------------------------------------------------------------
# argv -> options

# (daemon, argv, {attr: value}, ignored arguments)
PARSED = [
    # the Node.js client's suite: a bool flag takes no separate value, parsing
    # stops at "true", which is ignored (deflate is on, as in Go nsqd)
    ("nsqd", ["-http-address", "127.0.0.1:1", "-tcp-address", "127.0.0.1:2",
              "-tls-cert", "c.pem", "-tls-key", "key.pem", "-deflate", "true"],
     {"http_address": "127.0.0.1:1", "tcp_address": "127.0.0.1:2", "tls_key": "key.pem",
      "deflate": True}, ["true"]),
    # "-deflate false" leaves deflate on and stops the flags: -snappy=false is not read
    ("nsqd", ["-deflate", "false", "-snappy=false"], {"deflate": True, "snappy": True},
     ["false", "-snappy=false"]),
    ("nsqd", ["-deflate=false"], {"deflate": False}, []),
    ("nsqd", ["--deflate=0", "-snappy=F"], {"deflate": False, "snappy": False}, []),
    ("nsqd", ["-snappy=TRUE", "--snappy=t"], {"snappy": True}, []),
    # the four forms of a valued flag
    ("nsqd", ["-max-rdy-count", "5"], {"max_rdy_count": 5}, []),
    ("nsqd", ["--max-rdy-count", "5"], {"max_rdy_count": 5}, []),
    ("nsqd", ["-max-rdy-count=5"], {"max_rdy_count": 5}, []),
    ("nsqd", ["--max-rdy-count=5"], {"max_rdy_count": 5}, []),
    # the next argument is the value even when it looks like a flag
    ("nsqd", ["-log-prefix", "-deflate=false"], {"log_prefix": "-deflate=false",
                                                 "deflate": True}, []),
    # repeated: last wins for scalars, appends for lists
    ("nsqd", ["-max-rdy-count=5", "-max-rdy-count", "7"], {"max_rdy_count": 7}, []),
    ("nsqd", ["-lookupd-tcp-address", "a:1", "--lookupd-tcp-address=b:2"],
     {"lookupd_tcp_address": ["a:1", "b:2"]}, []),
    ("nsqd", ["-e2e-processing-latency-percentile", "0.5",
              "-e2e-processing-latency-percentile=0.99,1"],
     {"e2e_processing_latency_percentile": [1.0, 0.99, 0.5]}, []),
    # strconv.ParseInt(s, 0, 64) and time.ParseDuration
    ("nsqd", ["-max-rdy-count=0x10"], {"max_rdy_count": 16}, []),
    ("nsqd", ["-msg-timeout", "1.5h"], {"msg_timeout": 5400.0}, []),
    # strconv.ParseFloat: Go's literal syntax, digit separators included
    ("nsqd", ["-queue-scan-dirty-percent=1_2.5e-3"], {"queue_scan_dirty_percent": 0.0125}, []),
    ("nsqd", ["-queue-scan-dirty-percent=0x1p-2"], {"queue_scan_dirty_percent": 0.25}, []),
    ("nsqd", ["-msg-timeout=1h2m3.5s"], {"msg_timeout": 3723.5}, []),
    ("nsqd", ["-sync-timeout=500us"], {"sync_timeout": 0.0005}, []),
    ("nsqd", ["-sync-timeout=500µs"], {"sync_timeout": 0.0005}, []),
    # tls-required is a bool flag in Go (IsBoolFlag): "tcp-https" only with "="
    ("nsqd", ["-tls-cert=c", "-tls-key=k", "-tls-required", "tcp-https"],
     {"tls_required": nsqd_options.TLS_REQUIRED}, ["tcp-https"]),
    ("nsqd", ["-tls-cert=c", "-tls-key=k", "-tls-required=tcp-https"],
     {"tls_required": nsqd_options.TLS_REQUIRED_EXCEPT_HTTP}, []),
    # "--" and a lone "-" end the flags; what follows is ignored, -h included
    ("nsqd", ["-snappy=false", "--", "-tcp-address", "x:1"],
     {"snappy": False, "tcp_address": "0.0.0.0:4150"}, ["-tcp-address", "x:1"]),
    ("nsqd", ["-", "-max-rdy-count=3"], {"max_rdy_count": 2500}, ["-", "-max-rdy-count=3"]),
    ("nsqd", ["-deflate", "true", "-h"], {"deflate": True}, ["true", "-h"]),
    ("nsqd", ["--"], {}, []),
    ("nsqlookupd", ["-tcp-address", "127.0.0.1:1", "extra", "-http-address=127.0.0.1:2"],
     {"tcp_address": "127.0.0.1:1", "http_address": "0.0.0.0:4161"},
     ["extra", "-http-address=127.0.0.1:2"]),
    ("nsqlookupd", ["-tombstone-lifetime", "90s", "--tombstone-lifetime=1m"],
     {"tombstone_lifetime": 60.0}, []),
    ("nsqlookupd", ["--verbose", "true"], {"verbose": True}, ["true"]),
    ("nsqadmin", ["-proxy-graphite=false", "-admin-user", "a", "--admin-user=b"],
     {"proxy_graphite": False, "admin_user": ["a", "b"]}, []),
    ("nsqadmin", ["-http-client-tls-insecure-skip-verify", "true", "-base-path=/x"],
     {"http_client_tls_insecure_skip_verify": True, "base_path": "/"}, ["true", "-base-path=/x"]),
    ("nsqadmin", ["--nsqd-http-address", "127.0.0.1:4152"],
     {"nsqd_http_address": ["127.0.0.1:4151", "127.0.0.1:4152"]}, []),
]


@pytest.mark.parametrize("daemon,argv,expected,ignored", PARSED,
                         ids=[f"{d}:{' '.join(a)}" for d, a, _, _ in PARSED])
def test_argv_to_options(daemon, argv, expected, ignored):
    options, _, _, base = DAEMONS[daemon]
    opts = options.parse_args(base + argv)
    for attr, value in expected.items():
        assert getattr(opts, attr) == value, attr
    assert opts.ignored_args == ignored
    said = [w for w in opts.warnings if "arguments after the flags are ignored" in w]
    assert len(said) == (1 if ignored else 0)


def test_ignored_arguments_are_named_with_the_bool_flag_pitfall():
    opts = nsqd_options.parse_args(["-deflate", "false", "x"])
    assert opts.warnings == [
        "WARNING: arguments after the flags are ignored, as nsqd ignores them: \"false\" \"x\" "
        "(a bool flag takes a value only with '=': -deflate=false)"]
    # no hint when the last flag took its value
    opts = nsqd_options.parse_args(["-deflate=true", "false"])
    assert opts.warnings == ["WARNING: arguments after the flags are ignored, as nsqd ignores "
                             "them: \"false\""]


# --------------------------------------------------------------------------
# argv -> exit code and stderr (the message, then the usage, as flag.failf)

# (daemon, argv, exit code, first stderr line)
REFUSED = [
    ("nsqd", ["-nope"], 2, "flag provided but not defined: -nope"),
    ("nsqd", ["--nope=1", "-h"], 2, "flag provided but not defined: -nope"),
    ("nsqd", ["-max-rdy-count"], 2, "flag needs an argument: -max-rdy-count"),
    ("nsqd", ["-max-rdy-count=x"], 2, 'invalid value "x" for flag -max-rdy-count: parse error'),
    ("nsqd", ["-max-rdy-count", "1.5"], 2,
     'invalid value "1.5" for flag -max-rdy-count: parse error'),
    ("nsqd", ["-max-rdy-count=9223372036854775808"], 2,
     'invalid value "9223372036854775808" for flag -max-rdy-count: value out of range'),
    ("nsqd", ["-msg-timeout", "60"], 2, 'invalid value "60" for flag -msg-timeout: parse error'),
    ("nsqd", ["-msg-timeout=1d"], 2, 'invalid value "1d" for flag -msg-timeout: parse error'),
    ("nsqd", ["-queue-scan-dirty-percent=1__0"], 2,
     'invalid value "1__0" for flag -queue-scan-dirty-percent: parse error'),
    ("nsqd", ["-queue-scan-dirty-percent=_1"], 2,
     'invalid value "_1" for flag -queue-scan-dirty-percent: parse error'),
    ("nsqd", ["-deflate=yes"], 2, 'invalid boolean value "yes" for -deflate: parse error'),
    ("nsqd", ["-deflate="], 2, 'invalid boolean value "" for -deflate: parse error'),
    ("nsqd", ["---deflate"], 2, "bad flag syntax: ---deflate"),
    ("nsqd", ["-=true"], 2, "bad flag syntax: -=true"),
    ("nsqd", ["-log-level", "loud"], 2,
     "invalid value \"loud\" for flag -log-level: invalid log-level 'loud'"),
    ("nsqlookupd", ["-nope"], 2, "flag provided but not defined: -nope"),
    ("nsqlookupd", ["-inactive-producer-timeout=5"], 2,
     'invalid value "5" for flag -inactive-producer-timeout: parse error'),
    ("nsqlookupd", ["-tcp-address"], 2, "flag needs an argument: -tcp-address"),
    ("nsqadmin", ["-nope"], 2, "flag provided but not defined: -nope"),
    ("nsqadmin", ["-proxy-graphite=maybe"], 2,
     'invalid boolean value "maybe" for -proxy-graphite: parse error'),
    ("nsqadmin", ["-statsd-interval", "1"], 2,
     'invalid value "1" for flag -statsd-interval: parse error'),
]


@pytest.mark.parametrize("daemon,argv,code,first", REFUSED,
                         ids=[f"{d}:{' '.join(a)}" for d, a, _, _ in REFUSED])
def test_refused_command_line(daemon, argv, code, first, capsys):
    options, main, _, base = DAEMONS[daemon]
    assert main.main(base + argv) == code
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == first + "\n" + options.usage()


HELP = [(d, flag) for d in DAEMONS for flag in ("-h", "-help", "--help", "--h", "-help=x")]


@pytest.mark.parametrize("daemon,flag", HELP, ids=[f"{d}:{f}" for d, f in HELP])
def test_help_is_usage_on_stderr_and_exit_0(daemon, flag, capsys):
    options, main, _, base = DAEMONS[daemon]
    with pytest.raises(SystemExit) as exc:
        main.main(base + ["-log-prefix=x", flag, "-nope"])  # later errors are never read
    assert exc.value.code == 0
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", options.usage())
    assert out.err.startswith(f"Usage of {daemon}:\n")


@pytest.mark.parametrize("daemon", DAEMONS)
def test_exit_codes_of_the_real_command(daemon):
    _, _, command, base = DAEMONS[daemon]
    for argv, code, first in ((["-h"], 0, f"Usage of {daemon}:"),
                              (["-nope"], 2, "flag provided but not defined: -nope")):
        out = subprocess.run([sys.executable, "-m", "nsqshm.cli", command, *base, *argv],
                             capture_output=True, text=True, timeout=30)
        assert (out.returncode, out.stderr.splitlines()[0]) == (code, first)


# --------------------------------------------------------------------------
# flags accepted with no effect: said once each, only when given


def test_no_effect_flags_are_said_only_when_given(tmp_path):
    assert not [w for w in nsqd_options.parse_args([]).warnings if "no effect" in w]
    config = tmp_path / "nsqd.toml"
    config.write_text("queue_scan_selection_count = 5\n")
    opts = nsqd_options.parse_args(["--config", str(config), "-queue-scan-interval=1s",
                                    "-queue-scan-worker-pool-max", "2",
                                    "-queue-scan-dirty-percent=0.5", "-verbose"])
    said = [w for w in opts.warnings if "no effect" in w]
    assert [w.split()[2] for w in said] == [
        "-verbose", "-queue-scan-worker-pool-max", "-queue-scan-selection-count",
        "-queue-scan-interval", "-queue-scan-dirty-percent"]
    for line in said:
        assert line.startswith("WARNING: flag -")
        assert "is accepted but has no effect: " in line
    assert "sleeps until the earliest deadline" in said[-1]


@pytest.mark.parametrize("daemon", DAEMONS)
def test_no_effect_flags_say_why(daemon):
    options, *_ = DAEMONS[daemon]
    assert any(f.no_effect for f in options.FLAGS)  # verbose at least
    for flag in options.FLAGS:
        assert flag.no_effect == "" or len(flag.no_effect) > 20, flag.name
