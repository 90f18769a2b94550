"""servers/config (the example TOML configs, generated from the flag
declarations) and servers/systemd (the units): in sync, parsed, valid."""

import configparser
import importlib.util
import os
import re
import shutil
import subprocess

import pytest

from nsqshm.flags import parse_duration
from nsqshm.nsqadmin import options as nsqadmin_options
from nsqshm.nsqd import options as nsqd_options
from nsqshm.nsqlookupd import options as nsqlookupd_options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVERS = os.path.join(ROOT, "servers")

# config file -> (options module, the command-line flags it needs to validate)
CONFIGS = {
    "nsqd.toml": (nsqd_options, []),
    "nsqlookupd.toml": (nsqlookupd_options, []),
    # nsqadmin refuses to start without an address to ask: the file leaves both lists empty
    "nsqadmin.toml": (nsqadmin_options, ["--nsqd-http-address=127.0.0.1:4151"]),
}


def generator():
    spec = importlib.util.spec_from_file_location(
        "generate_configs", os.path.join(SERVERS, "generate_configs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configs_are_in_sync_with_the_flag_declarations(capsys):
    gen = generator()
    assert sorted(gen.DAEMONS) == sorted(CONFIGS)
    assert gen.main(["--check"]) == 0, capsys.readouterr().out  # else: run it
    for name in CONFIGS:
        with open(os.path.join(SERVERS, "config", name)) as f:
            assert f.read() == gen.render(name)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_lists_every_option_at_its_default_and_parses(name):
    options, argv = CONFIGS[name]
    path = os.path.join(SERVERS, "config", name)
    text = open(path).read()
    for flag in options.FLAGS:
        if flag.cfg_name is None:
            assert f"--{flag.name}" in text.splitlines()[3]  # named as command-line only
            continue
        line = re.search(rf"^(# )?{flag.cfg_name} =.*$", text, re.M)
        assert line, flag.cfg_name
        # commented out: a host-derived default, or an option with no effect (said why)
        assert bool(line.group(1)) == (callable(flag.default) or bool(flag.no_effect))
        if flag.no_effect:
            assert flag.no_effect.split()[-1] in text
    opts = options.parse_args(["--config", path, *argv])
    assert opts.warnings == []
    defaults = options.FLAGSET.defaults()
    for flag in options.FLAGS:
        if flag.cfg_name and not callable(flag.default) and not flag.no_effect \
                and f"--{flag.name}" not in " ".join(argv):
            assert getattr(opts, flag.attr) == getattr(defaults, flag.attr), flag.name
            assert flag.name in opts.from_config


def test_an_edited_value_is_read(tmp_path):
    text = open(os.path.join(SERVERS, "config", "nsqd.toml")).read()
    edited = text.replace('\nmsg_timeout = "1m0s"\n', '\nmsg_timeout = "30s"\n')
    edited = edited.replace("\n# queue_scan_interval = ", "\nqueue_scan_interval = ")
    assert edited.count("\n") == text.count("\n") and edited != text
    (tmp_path / "nsqd.toml").write_text(edited)
    opts = nsqd_options.parse_args(["--config", str(tmp_path / "nsqd.toml")])
    assert opts.msg_timeout == 30.0
    # uncommented, an option with no effect says so
    assert [w.split()[2] for w in opts.warnings] == ["-queue-scan-interval"]


# --------------------------------------------------------------------------
# systemd units

UNITS = ["nsqshm-nsqd.service", "nsqshm-nsqlookupd.service", "nsqshm-nsqadmin.service"]


def unit(name):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(os.path.join(SERVERS, "systemd", name))
    return parser


def test_units_stop_and_reload_as_the_daemons_need():
    nsqd = unit("nsqshm-nsqd.service")["Service"]
    assert nsqd["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert nsqd["KillMode"] == "mixed"  # SIGTERM to the supervisor only
    graceful = parse_duration(nsqd_options.FLAGS_BY_NAME["graceful-timeout"].default)
    assert parse_duration(nsqd["TimeoutStopSec"]) > graceful
    assert nsqd["RemoveIPC"] == "no" and "DynamicUser" not in nsqd  # the rings outlive a stop
    assert nsqd["ExecStart"].endswith(" start --config=/etc/nsqshm/nsqd.toml")
    for name in UNITS[1:]:
        service = unit(name)["Service"]
        assert "ExecReload" not in service  # SIGHUP would end them, as Go's
    for name in UNITS:
        service = unit(name)["Service"]
        for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                           ("PrivateTmp", "yes"), ("PrivateDevices", "yes"),
                           ("CapabilityBoundingSet", "")]:
            assert service[key] == value, (name, key)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_units_verify_and_are_hardened(tmp_path):
    for name in UNITS:
        text = open(os.path.join(SERVERS, "systemd", name)).read()
        # verify wants ExecStart's program to exist on this machine
        (tmp_path / name).write_text(text.replace("/opt/nsqshm/bin/nsqshm", "/bin/true"))
    paths = [str(tmp_path / name) for name in UNITS]
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", *paths],
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr) == (0, "")  # any unknown or bad key is a line here
    for path in paths:
        out = subprocess.run(["systemd-analyze", "security", "--offline=yes", path],
                             capture_output=True, text=True, timeout=60)
        level = re.search(r"Overall exposure level for \S+: ([\d.]+)", out.stdout)
        assert level and float(level.group(1)) <= 2.0, out.stdout[-2000:]


# --------------------------------------------------------------------------
# the cluster's supervisord.conf


def test_cluster_stop_waits_for_the_graceful_timeout():
    parser = configparser.RawConfigParser(strict=False, inline_comment_prefixes=(";",))
    parser.read(os.path.join(SERVERS, "cluster", "supervisord.conf"))
    nsqds = [s for s in parser.sections() if s.startswith("program:nsqd")]
    assert len(nsqds) == 3
    for section in nsqds:
        command = parser[section]["command"]
        graceful = parse_duration(re.search(r"--graceful-timeout=(\S+)", command).group(1))
        assert int(parser[section]["stopwaitsecs"]) > graceful
        assert parser[section]["stopasgroup"] == "false"
        assert parser[section]["killasgroup"] == "true"
    lookupds = [s for s in parser.sections() if s.startswith("program:nsqlookupd")]
    admins = [s for s in parser.sections() if s.startswith("program:nsqadmin")]
    assert (len(lookupds), len(admins)) == (2, 1)
    # lookupds up first and down last, nsqadmin up last and down first
    assert max(int(parser[s]["priority"]) for s in lookupds) \
        < min(int(parser[s]["priority"]) for s in nsqds) \
        < min(int(parser[s]["priority"]) for s in admins)
