"""`python -m bench.disk [flags]` = `nsqshm bench disk [flags]`."""

from bench import run

if __name__ == "__main__":
    run("disk")
