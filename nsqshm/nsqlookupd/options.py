"""nsqlookupd command-line flags and config file, compatible with nsqlookupd 1.3
(apps/nsqlookupd/main.go nsqlookupdFlagSet, nsqlookupd.NewOptions).

Parsing is the shared machinery of ``nsqshm.flags`` (Go ``flag`` syntax, the
``--config`` TOML file keyed by the flag names with ``_``, explicit flag >
config file > default).
"""

from __future__ import annotations

from nsqshm import flags
from nsqshm.consistence import options as cluster_options
from nsqshm.flags import (
    BOOL,
    DURATION,
    LOGLEVEL,
    STRING,
    Flag,
    FlagError,
    FlagSet,
    OptionsError,
    hostname,
    listen_address_kind,
)

__all__ = ["FLAGS", "FLAGSET", "FlagError", "Options", "OptionsError", "defaults", "parse_args",
           "usage", "validate"]

# apps/nsqlookupd/main.go order; defaults from nsqlookupd.NewOptions()
FLAGS: tuple[Flag, ...] = (
    Flag("config", STRING, "", "path to config file", cfg=None),
    Flag("version", BOOL, False, "print version string", cfg=None),
    Flag("log-level", LOGLEVEL, "info", "set log verbosity: debug, info, warn, error, or fatal"),
    Flag("log-prefix", STRING, "[nsqlookupd] ", "log message prefix"),
    Flag("verbose", BOOL, False, "[deprecated] has no effect, use --log-level", cfg=None,
         no_effect="deprecated in nsqlookupd, where it has no effect either"),
    Flag("tcp-address", STRING, "0.0.0.0:4160", "<addr>:<port> to listen on for TCP clients"),
    Flag("http-address", STRING, "0.0.0.0:4161", "<addr>:<port> to listen on for HTTP clients"),
    Flag("broadcast-address", STRING, hostname,
         "address of this lookupd node, (default to the OS hostname)"),
    Flag("inactive-producer-timeout", DURATION, "5m0s",
         "duration of time a producer will remain in the active list since its last ping"),
    Flag("tombstone-lifetime", DURATION, "45s",
         "duration of time a producer will remain tombstoned if registration remains"),
    # youzan/nsq's (apps/nsqlookupd): writers (access=w) are not told of a node
    # that has no channel of the topic, so nothing piles up that nobody reads
    Flag("allow-write-with-nochannels", BOOL, False, "allow write to topic with no channels"),
) + cluster_options.LOOKUPD  # youzan/nsq's cluster mode (consistence/options.py)


class Options(flags.Options):
    """nsqlookupd's options: one attribute per flag in FLAGS."""


def validate(opts: Options) -> None:
    """What would make nsqlookupd.New fail before it listens, as one line."""
    for name in ("tcp-address", "http-address"):
        addr = getattr(opts, name.replace("-", "_"))
        if addr and listen_address_kind(addr) == "unix":
            raise OptionsError(f"--{name} {flags.go_quote(addr)}: missing port in address")
        if addr:
            flags.check_listen_address(name, addr)
    cluster_options.validate(opts, workers=0)


FLAGSET = FlagSet("nsqlookupd", FLAGS, validate=validate, options_class=Options)


def defaults() -> Options:
    return FLAGSET.defaults()


def parse_args(argv: list[str]) -> Options:
    """Parse nsqlookupd arguments (without the program name); see FlagSet.parse_args."""
    return FLAGSET.parse_args(argv)


def usage() -> str:
    return FLAGSET.usage()
