"""The `nsqshm` command: a thin shell over the library.

    nsqshm start    nsqd (the broker)
    nsqshm lookupd  nsqlookupd
    nsqshm admin    nsqadmin
    nsqshm bench    the benchmark harness
"""

import importlib
import sys

from nsqshm import __version__

EXIT_USAGE = 2

# subcommand -> (module with main(argv), one-line description)
COMMANDS = {
    "start": ("nsqshm.nsqd.main", "run nsqd, the broker"),
    "lookupd": ("nsqshm.nsqlookupd.main", "run nsqlookupd, the discovery service"),
    "admin": ("nsqshm.nsqadmin.main", "run nsqadmin, the web UI"),
    "bench": ("nsqshm.bench.main", "run benchmarks"),
}


def usage():
    lines = [f"usage: nsqshm <command> [flags]   (nsqshm {__version__})", "", "commands:"]
    lines += [f"  {name:<9} {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "`nsqshm <command> --help` for a command's flags."]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else EXIT_USAGE
    if argv[0] in ("--version", "-version", "version"):
        print(f"nsqshm {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"nsqshm: unknown command {name!r} (try: {', '.join(COMMANDS)})", file=sys.stderr)
        return EXIT_USAGE
    module_name, _ = COMMANDS[name]
    # imported on demand: a subcommand loads its own daemon only
    return importlib.import_module(module_name).main(rest)


if __name__ == "__main__":
    sys.exit(main())
