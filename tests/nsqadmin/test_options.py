"""nsqadmin 1.3's flags, their defaults and its start-up errors."""

import subprocess
import sys

import pytest

from nsqshm.nsqadmin import options
from nsqshm.nsqadmin.options import VERSION_STRING


def run_admin(*args, timeout=20):
    return subprocess.run([sys.executable, "-m", "nsqshm.cli", "admin", *args],
                          capture_output=True, text=True, timeout=timeout)


# nsqadmin.NewOptions() and apps/nsqadmin/main.go, as /config/<opt> shows them
NSQADMIN_DEFAULTS = {
    "log_level": 2,
    "log_prefix": "[nsqadmin] ",
    "http_address": "0.0.0.0:4171",
    "base_path": "/",
    "dev_static_dir": "",
    "graphite_url": "",
    "proxy_graphite": False,
    "statsd_counter_format": "stats.counters.%s.count",
    "statsd_gauge_format": "stats.gauges.%s",
    "statsd_prefix": "nsq.%s",
    "statsd_interval": 60_000_000_000,
    "notification_http_endpoint": "",
    "http_client_connect_timeout": 2_000_000_000,
    "http_client_request_timeout": 5_000_000_000,
    "http_client_tls_insecure_skip_verify": False,
    "http_client_tls_root_ca_file": "",
    "http_client_tls_cert": "",
    "http_client_tls_key": "",
    "allow_config_from_cidr": "127.0.0.1/8",
    "acl_http_header": "X-Forwarded-User",
    "nsqlookupd_http_addresses": [],
    "nsqd_http_addresses": [],
    "admin_users": [],
}

NSQADMIN_FLAGS = [
    "acl-http-header", "admin-user", "allow-config-from-cidr", "base-path", "config",
    "dev-static-dir", "graphite-url", "http-address", "http-client-connect-timeout",
    "http-client-request-timeout", "http-client-tls-cert", "http-client-tls-insecure-skip-verify",
    "http-client-tls-key", "http-client-tls-root-ca-file", "log-level", "log-prefix",
    "lookupd-http-address", "notification-http-endpoint", "nsqd-http-address", "proxy-graphite",
    "statsd-counter-format", "statsd-gauge-format", "statsd-interval", "statsd-prefix", "verbose",
    "version",
]


def test_defaults_are_nsqadmins():
    assert options.FLAGSET.defaults().to_config_dict(go_types=True) == NSQADMIN_DEFAULTS


def test_usage_lists_every_nsqadmin_flag():
    text = options.FLAGSET.usage()
    assert text.startswith("Usage of nsqadmin:\n")
    listed = [line.split()[0].lstrip("-") for line in text.splitlines()[1:]
              if line.startswith("  -")]
    assert listed == NSQADMIN_FLAGS


def test_repeatable_and_both_flag_forms():
    opts = options.parse_args(["-lookupd-http-address", "a:4161", "--lookupd-http-address=b:4161",
                               "--admin-user=alice", "-admin-user", "bob",
                               "--statsd-interval=10s", "--base-path=admin/"])
    assert opts.lookupd_http_address == ["a:4161", "b:4161"]
    assert opts.admin_user == ["alice", "bob"]
    assert opts.statsd_interval == 10.0
    assert opts.base_path == "/admin"  # normalizeBasePath


def test_config_file_keys(tmp_path):
    cfg = tmp_path / "nsqadmin.toml"
    cfg.write_text('nsqlookupd_http_addresses = ["127.0.0.1:4161"]\nadmin_users = ["ops"]\n'
                   'acl_http_header = "X-Auth-User"\nlog_level = "debug"\n'
                   'notification_http_endpoint = "http://hook.example/x"\n')
    opts = options.parse_args([f"--config={cfg}", "--admin-user=cli"])
    assert opts.lookupd_http_address == ["127.0.0.1:4161"]
    assert opts.admin_user == ["cli"]  # an explicit flag wins over the file
    assert opts.acl_http_header == "X-Auth-User"
    assert opts.log_level == "debug"
    assert opts.notification_http_endpoint == "http://hook.example/x"


@pytest.mark.parametrize("path, normal", [("", "/"), ("/", "/"), ("admin", "/admin"),
                                          ("/admin/", "/admin"), ("//a/./b/../c", "/a/c")])
def test_base_path_is_normalized_as_nsqadmin(path, normal):
    assert options.normalize_base_path(path) == normal


@pytest.mark.parametrize("args, message", [
    ([], "--nsqd-http-address or --lookupd-http-address required"),
    (["--nsqd-http-address=127.0.0.1:4151", "--lookupd-http-address=127.0.0.1:4161"],
     "use --nsqd-http-address or --lookupd-http-address not both"),
    (["--nsqd-http-address=127.0.0.1:4151", "--http-client-tls-cert=c.pem"],
     "--http-client-tls-key must be specified with --http-client-tls-cert"),
    (["--nsqd-http-address=127.0.0.1:4151", "--allow-config-from-cidr=10.0.0.1"],
     "failed to parse --allow-config-from-cidr (10.0.0.1) - invalid CIDR address: 10.0.0.1"),
])
def test_bad_flags_are_one_line_and_exit_2(args, message):
    result = run_admin(*args)
    assert result.returncode == 2
    assert result.stderr == f"nsqadmin: {message} (see --help)\n"


@pytest.mark.parametrize("args, message", [
    (["--nsqd-http-address=127.0.0.1:4151", "--bogus"], "flag provided but not defined: -bogus"),
    (["--nsqd-http-address=127.0.0.1:4151", "--statsd-interval=5"],
     'invalid value "5" for flag -statsd-interval: parse error'),
    (["--nsqd-http-address=127.0.0.1:4151", "--log-level=loud"],
     "invalid value \"loud\" for flag -log-level: invalid log-level 'loud'"),
])
def test_bad_command_line_is_go_flags_message_then_usage_and_exit_2(args, message):
    result = run_admin(*args)
    assert result.returncode == 2
    assert result.stderr == message + "\n" + options.usage()


def test_version():
    result = run_admin("--version")
    assert result.returncode == 0
    assert result.stdout == VERSION_STRING + "\n"
    assert VERSION_STRING.startswith("nsqadmin v1.3.0 (built w/nsqshm-")


def test_unresolvable_address_is_fatal_exit_1():
    result = run_admin("--nsqd-http-address=127.0.0.1")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].endswith(
        "FATAL: failed to instantiate nsqadmin - failed to resolve --nsqd-http-address "
        "(127.0.0.1) - address 127.0.0.1: missing port in address")


def test_busy_port_is_fatal_exit_1(admin_factory):
    first = admin_factory("--nsqd-http-address=127.0.0.1:4151")
    result = run_admin(f"--http-address=127.0.0.1:{first.port}",
                       "--nsqd-http-address=127.0.0.1:4151")
    assert result.returncode == 1
    assert f"FATAL: failed to instantiate nsqadmin - listen (127.0.0.1:{first.port}) failed - " \
        in result.stderr


def test_logs_and_sigterm(admin_factory):
    admin = admin_factory("--nsqd-http-address=127.0.0.1:4151", "--log-prefix=[adm] ")
    assert admin.lines[0].startswith("[adm] ")
    assert admin.lines[0].rstrip().endswith("INFO: " + VERSION_STRING)
    assert f"INFO: HTTP: listening on 127.0.0.1:{admin.port}" in admin.lines[1]
    assert admin.stop() == 0
