"""`nsqshm admin`: a drop-in for the nsqadmin binary.  A thin shell: flags,
logging, the listener, signals; the service is
nsqshm.nsqadmin.nsqadmin.NSQAdmin."""

import sys

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2


def main(argv):
    from nsqshm.nsqadmin.options import VERSION_STRING, FlagError, OptionsError, parse_args, usage

    try:
        opts = parse_args(list(argv))
    except FlagError as err:  # as Go's flag.ExitOnError: the message, the usage, exit 2
        sys.stderr.write(f"{err}\n{usage()}")
        return EXIT_USAGE
    except OptionsError as err:
        print(f"nsqadmin: {err} (see --help)", file=sys.stderr)
        return EXIT_USAGE
    if opts.version:
        print(VERSION_STRING)
        return EXIT_OK

    from nsqshm.greenlets import patch_all

    patch_all()
    import signal

    import gevent
    import gevent.event

    from nsqshm.flags import format_address
    from nsqshm.nsqadmin.nsqadmin import NSQAdmin, StartError
    from nsqshm.nsqd.log import Logger

    log = Logger(prefix=opts.log_prefix, level=opts.log_level)
    for line in opts.warnings:
        log.warn(line.removeprefix("WARNING: "))
    log.info(VERSION_STRING)
    stop = gevent.event.Event()  # handlers first: a signal during start-up is not lost

    def handle_stop():  # signal handlers only queue
        stop.set()

    gevent.signal_handler(signal.SIGTERM, handle_stop)
    gevent.signal_handler(signal.SIGINT, handle_stop)
    admin = NSQAdmin(opts, log=log)
    try:
        http = admin.start()
    except StartError as err:
        log.fatal(f"failed to instantiate nsqadmin - {err}")
        return EXIT_FATAL
    log.info(f"HTTP: listening on {format_address(http)}")

    stop.wait()
    log.info(f"HTTP: closing {format_address(http)}")
    admin.stop()
    return EXIT_OK
