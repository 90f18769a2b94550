"""`nsqshm start`: a drop-in for the nsqd binary.  A thin shell: flags,
logging, then the supervisor (arbiter.py), which forks the workers
(worker.py), each one nsqshm.nsqd.nsqd.NSQD over the shared rings."""

import os
import sys

from nsqshm import NSQD_COMPAT_VERSION, __version__

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2


def check_writable(path):
    probe = os.path.join(path, f".nsqshm-check.{os.getpid()}")
    with open(probe, "w"):
        pass
    os.unlink(probe)


def main(argv):
    from nsqshm.nsqd.options import (
        FlagError,
        OptionsError,
        listen_address_kind,
        parse_args,
        usage,
    )

    try:
        opts = parse_args(list(argv))
    except FlagError as err:  # as Go's flag.ExitOnError: the message, the usage, exit 2
        sys.stderr.write(f"{err}\n{usage()}")
        return EXIT_USAGE
    except OptionsError as err:
        print(f"nsqd: {err} (see --help)", file=sys.stderr)
        return EXIT_USAGE
    if opts.version:
        print(f"nsqd v{NSQD_COMPAT_VERSION} (built w/nsqshm-{__version__})")
        return EXIT_OK
    opts.argv = list(argv)  # SIGHUP re-reads them

    from nsqshm.nsqd.local import instance
    from nsqshm.nsqd.log import Logger
    from nsqshm.nsqd.workers.arbiter import Arbiter, set_proctitle
    from nsqshm.nsqd.workers.worker import main as worker_main

    log = Logger(prefix=opts.log_prefix, level=opts.log_level)
    for line in getattr(opts, "warnings", []):
        log.warn(line.removeprefix("WARNING: "))
    log.info(f"nsqd v{NSQD_COMPAT_VERSION} (built w/nsqshm-{__version__})")
    log.info(f"ID: {opts.node_id}")
    data_path = os.path.abspath(opts.data_path or ".")
    prefix = instance.prefix_for(data_path, opts.shm_prefix)
    try:
        check_writable(data_path)
    except OSError as err:  # one clear line, before any worker exists
        log.fatal(f"failed to start nsqd - {err}")
        return EXIT_FATAL
    arbiter = Arbiter(opts, list(argv), log, worker_main, parse_args)
    set_proctitle(f"nsqshm: supervisor of {arbiter.nworkers} workers (data {data_path})")
    listening = []

    def on_ready(arb):
        # the instance file first: a client may act on the "listening" lines at once
        instance.write(prefix, instance.record(
            prefix, data_path, arb.addresses.get("tcp_address"),
            arb.addresses.get("http_address"), arb.nworkers, opts))
        for key, name in (("tcp_address", "TCP"), ("http_address", "HTTP"),
                          ("https_address", "HTTPS")):
            address = arb.addresses.get(key)
            if address is None and listen_address_kind(getattr(opts, key) or "") == "unix":
                address = getattr(opts, key)  # a socket path, worker 0's
            if address:
                log.info(f"{name}: listening on {address}")
                listening.append((name, address))

    try:
        code = arbiter.run(on_ready)
    except OSError as err:  # a port in use, an unusable address
        log.fatal(f"failed to start nsqd - {err}")
        return EXIT_FATAL
    finally:
        instance.remove(prefix, pid=os.getpid())
    for name, address in listening:
        log.info(f"{name}: closing {address}")
    if code == EXIT_OK:
        log.info("NSQ: bye")
    return code
