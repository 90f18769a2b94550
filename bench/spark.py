"""`python -m bench.spark [flags]` = `nsqshm bench spark [flags]` (issue 9's method, now
the suite nsqshm/bench/spark.py: --messages, --runs, --partitions, --batch, --json)."""

from bench import run

if __name__ == "__main__":
    run("spark")
