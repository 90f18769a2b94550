"""`nsqshm start`: a drop-in for the nsqd binary.  A thin shell: flags,
logging, listeners, signals; the broker is nsqshm.nsqd.nsqd.NSQD."""

import sys

from nsqshm import NSQD_COMPAT_VERSION, __version__

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2


def format_address(address):
    if isinstance(address, str):  # a unix socket path
        return address
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def main(argv):
    from nsqshm.nsqd.options import OptionsError, parse_args, unimplemented_flags_set

    try:
        opts = parse_args(list(argv))
    except OptionsError as err:
        print(f"nsqd: {err} (see --help)", file=sys.stderr)
        return EXIT_USAGE
    if opts.version:
        print(f"nsqd v{NSQD_COMPAT_VERSION} (built w/nsqshm-{__version__})")
        return EXIT_OK

    from gevent import monkey

    monkey.patch_all()
    import signal

    import gevent
    import gevent.event

    from nsqshm.nsqd.log import Logger
    from nsqshm.nsqd.nsqd import NSQD

    log = Logger(prefix=opts.log_prefix, level=opts.log_level)
    for line in getattr(opts, "warnings", []):
        log.warn(line.removeprefix("WARNING: "))
    for name in unimplemented_flags_set(opts):
        log.warn(f"flag -{name} is accepted but not implemented yet")
    log.info(f"nsqd v{NSQD_COMPAT_VERSION} (built w/nsqshm-{__version__})")
    log.info(f"ID: {opts.node_id}")
    stop = gevent.event.Event()  # handlers first: a signal during start-up is not lost

    def handle_stop():  # signal handlers only queue
        stop.set()

    gevent.signal_handler(signal.SIGTERM, handle_stop)
    gevent.signal_handler(signal.SIGINT, handle_stop)
    try:
        nsqd = NSQD(opts, log=log)
        tcp, http = nsqd.start()
    except (OSError, RuntimeError) as err:
        log.fatal(f"failed to start nsqd - {err}")
        return EXIT_FATAL
    log.info(f"TCP: listening on {format_address(tcp)}")
    if http is not None:
        log.info(f"HTTP: listening on {format_address(http)}")
    if nsqd.https_server is not None:
        log.info(f"HTTPS: listening on {format_address(nsqd.https_server.address)}")

    stop.wait()
    log.info(f"TCP: closing {format_address(tcp)}")
    if http is not None:
        log.info(f"HTTP: closing {format_address(http)}")
    if nsqd.https_server is not None:
        log.info(f"HTTPS: closing {format_address(nsqd.https_server.address)}")
    nsqd.stop()
    log.info("NSQ: bye")
    return EXIT_OK
