"""The suites live in nsqshm/bench/ and run as `nsqshm bench SUITE [flags]`
(docs/bench.md); bench/SUITE.py keeps `python -m bench.SUITE [flags]` working.
Results: bench/results/*.json, bench/RESULTS.md, bench/plots/."""

import sys


def run(name):
    from nsqshm.bench.main import main

    sys.exit(main([name, *sys.argv[1:]]))
