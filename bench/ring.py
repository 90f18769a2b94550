"""`python -m bench.ring [flags]` = `nsqshm bench ring [flags]`."""

from bench import run

if __name__ == "__main__":
    run("ring")
