"""`python -m bench.tcp [flags]` = `nsqshm bench tcp [flags]`."""

from bench import run

if __name__ == "__main__":
    run("tcp")
