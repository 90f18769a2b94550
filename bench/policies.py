"""`python -m bench.policies [flags]` = `nsqshm bench policies [flags]`."""

from bench import run

if __name__ == "__main__":
    run("policies")
