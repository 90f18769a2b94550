"""`python -m bench.transport [flags]` = `nsqshm bench transport [flags]`."""

from bench import run

if __name__ == "__main__":
    run("transport")
