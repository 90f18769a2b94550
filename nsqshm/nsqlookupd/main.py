"""`nsqshm lookupd`: a drop-in for the nsqlookupd binary.  A thin shell:
flags, logging, listeners, signals; the service is
nsqshm.nsqlookupd.nsqlookupd.NSQLookupd."""

import sys

from nsqshm import NSQD_COMPAT_VERSION, __version__
from nsqshm.flags import format_address

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2
VERSION_STRING = f"nsqlookupd v{NSQD_COMPAT_VERSION} (built w/nsqshm-{__version__})"


def main(argv):
    from nsqshm.nsqlookupd.options import FlagError, OptionsError, parse_args, usage

    try:
        opts = parse_args(list(argv))
    except FlagError as err:  # as Go's flag.ExitOnError: the message, the usage, exit 2
        sys.stderr.write(f"{err}\n{usage()}")
        return EXIT_USAGE
    except OptionsError as err:
        print(f"nsqlookupd: {err} (see --help)", file=sys.stderr)
        return EXIT_USAGE
    if opts.version:
        print(VERSION_STRING)
        return EXIT_OK

    from nsqshm.greenlets import patch_all

    patch_all()
    import signal

    import gevent
    import gevent.event

    from nsqshm.nsqd.log import Logger
    from nsqshm.nsqlookupd.nsqlookupd import NSQLookupd

    log = Logger(prefix=opts.log_prefix, level=opts.log_level)
    for line in opts.warnings:
        log.warn(line.removeprefix("WARNING: "))
    log.info(VERSION_STRING)
    stop = gevent.event.Event()  # handlers first: a signal during start-up is not lost

    def handle_stop():  # signal handlers only queue
        stop.set()

    gevent.signal_handler(signal.SIGTERM, handle_stop)
    gevent.signal_handler(signal.SIGINT, handle_stop)
    lookupd = NSQLookupd(opts, log=log)
    try:
        tcp, http = lookupd.start()
    except OSError as err:
        log.fatal(f"failed to instantiate nsqlookupd - {err}")
        return EXIT_FATAL
    log.info(f"TCP: listening on {format_address(tcp)}")
    log.info(f"HTTP: listening on {format_address(http)}")

    stop.wait()
    log.info(f"TCP: closing {format_address(tcp)}")
    log.info(f"HTTP: closing {format_address(http)}")
    lookupd.stop()
    return EXIT_OK
