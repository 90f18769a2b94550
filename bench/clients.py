"""`python -m bench.clients [flags]` = `nsqshm bench clients [flags]`."""

from bench import run

if __name__ == "__main__":
    run("clients")
