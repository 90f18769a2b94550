"""The harness itself, fast enough for the default run: the tcp suite
against a running nsqshm, the CLI's skips, the workers-mode detection."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from nsqshm.bench import loadgen, logtopic, server, tcp, workers
from nsqshm.bench import main as bench_main


@pytest.fixture(scope="module")
def nsqshm():
    target = server.start_nsqshm(["--mem-queue-size=100000"])
    yield target
    target.close()


def test_tcp_quick_json_against_a_running_server(nsqshm):
    host, port = nsqshm.tcp
    cmd = [sys.executable, "-m", "nsqshm.cli", "bench", "tcp", "--quick", "--json",
           "--no-progress", f"--nsqd-tcp-address={host}:{port}",
           f"--nsqd-http-address={nsqshm.http[0]}:{nsqshm.http[1]}", f"--nsqd-pid={nsqshm.pid}",
           "--messages=20000", "--sizes=1024", "--fanout=2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout)  # the figures alone on stdout; lines went to stderr
    assert "run 1: in" in done.stderr
    assert res["suite"] == "tcp" and res["server"]["kind"] == "external"
    assert res["command"].startswith("nsqshm bench tcp --quick")
    assert {"cpus", "kernel", "python", "loadavg"} <= res["machine"].keys()
    m = res["median"]
    for key in ("in_msgs_per_s", "out_msgs_per_s", "raw_in_msgs_per_s", "raw_out_msgs_per_s",
                "server_cpu_us_per_msg_in", "server_cpu_us_per_msg_out"):
        assert m[key] > 0, key
    # the generator alone (raw socket) against its rate through the broker
    assert res["loadgen"]["alone_in_msgs_per_s"] > 0 and res["loadgen"]["headroom_out"] > 0
    assert res["channel_after"] == {"message_count": 20000, "in_flight_count": 0, "depth": 0,
                                    "requeue_count": 0, "timeout_count": 0}
    assert [r["size"] for r in res["sizes"]] == [1024] and res["sizes"][0]["out_msgs_per_s"] > 0
    fan = res["fanout"][0]
    assert fan["channels"] == 2 and fan["out_msgs_per_s"] > 0


def test_consumers_answer_fin_per_write_with_req_and_touch(nsqshm):
    """The load generator's client patterns (loadgen.Pattern): one send per
    command, 1 in 5 messages REQ'd (they come back) and 1 in 5 TOUCHed:
    every message is finished, and the broker counted the REQs."""
    spec = tcp.spec_for(argparse.Namespace(messages=20_000, size=200, batch=200, window=4,
                                           rdy=500, publishers=1, consumers=2))
    mix = loadgen.Pattern(fin_per_write=True, req_every=5, touch_every=5)
    res = loadgen.run_phases(nsqshm, spec, pattern=mix)
    after = res["channel_after"]
    assert after["message_count"] == 20_000 and after["depth"] == 0
    assert after["in_flight_count"] == 0
    # each delivery has a 1 in 5 chance of a REQ: about 5000 of them
    assert 3_000 < after["requeue_count"] < 8_000


def _run(argv, capsys):
    rc = bench_main.main([*argv, "--json", "--no-progress"])
    return rc, json.loads(capsys.readouterr().out)


def test_workers_flag_rejected_is_not_available(monkeypatch):
    def rejected(extra):
        raise server.ServerRejected(2, "nsqd: flag provided but not defined: -workers")

    monkeypatch.setattr(workers, "start_nsqshm", rejected)
    assert "does not take --workers" in workers.available()


def test_workers_flag_ignored_is_not_available(monkeypatch):
    class OneProcess:
        def processes(self):
            return 1

        def close(self):
            pass

    monkeypatch.setattr(workers, "start_nsqshm", lambda extra: OneProcess())
    assert "runs as 1 process" in workers.available(wait=0)


@pytest.mark.parametrize("suite", ["workers", "local", "spark", "clients", "headers"])
def test_suites_that_start_nsqshm_skip_for_an_external_server(suite, capsys):
    rc, res = _run([suite, "--nsqd-tcp-address=127.0.0.1:1"], capsys)
    assert rc == 0 and "starts nsqshm itself" in res["skipped"]


def test_commitlog_measures_append_and_replay_against_raw_io(capsys, tmp_path):
    rc, res = _run(["commitlog", "--quick", "--append", "20000", "--read", "50000",
                    "--cut-mb", "8", "--dir", str(tmp_path)], capsys)
    assert rc == 0 and [row["batch"] for row in res["append"]] == ["200 msgs", "1 MiB"]
    read = res["read"]
    assert 50_000 - 4_600 < read["messages"] <= 50_000 and read["bytes"] >= read["messages"] * 230
    assert read["ratio"] > 0 and read["log_GB_per_s"] > 0
    cut = res["cut"]  # a cut on the hub's pool, the loop's lateness meanwhile
    assert cut["segment_mb"] == 8 and cut["keep"] == cut["messages"] * 9 // 10
    assert cut["cut_s"] > 0 and cut["cut_max_ms"] >= cut["cut_p99_ms"] >= 0
    assert not any(tmp_path.iterdir())  # the logs are removed


def test_putback_measures_against_a_ring_push(capsys):
    rc, res = _run(["putback", "--quick", "--messages", "5000"], capsys)
    assert rc == 0 and res["params"]["messages"] == 5000
    assert res["put_back_msgs_per_s"] > 0 and res["ring_push_msgs_per_s"] > 0
    assert res["ratio"] > 0 and res["note_full_us"] > 0 and res["note_room_us"] > 0
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("nsqshm-bench-pb-")]


def test_help_lists_every_suite(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_main.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for name in ("ring", "tcp", "latency", "disk", "transport", "workers", "local", "spark",
                 "clients", "commitlog", "putback", "all", "writer", "reader", "fanout", "report"):
        assert name in text


def test_connections_pinned_to_each_worker():
    """The cross-worker hop needs a connection on a chosen worker: the
    harness reconnects until /stats shows it there."""
    target = server.start_nsqshm(["--workers=2"])
    try:
        if target.processes() < 3:
            pytest.skip("the workers mode is not built")
        topic = "pin_test"
        workers._http(target, f"/topic/create?topic={topic}", "POST")
        owner = workers.topic_owner(target, topic)
        assert owner in (0, 1)
        for worker in (0, 1):
            for subscribe in (True, False):
                sock = workers.pinned(target, worker, topic, subscribe)
                probe = topic if subscribe else topic + "_probe"
                assert workers._worker_of(target, probe, sock.getsockname()[1]) == worker
                sock.close()
    finally:
        target.close()


def test_logtopic_runs_the_fanout_again_with_the_brokers_default_memory(capsys):
    """The last case's classic channels spill to their disk queues (nsqd's
    default --mem-queue-size): 30,000 messages are more than its 10,000."""
    rc, res = _run(["logtopic", "--quick", "--messages", "30000", "--runs", "1"], capsys)
    assert rc == 0
    assert [(c["channels"], c["memory"]) for c in res["cases"]] == [
        (1, logtopic.WHOLE), (4, logtopic.WHOLE), (4, logtopic.DEFAULTS)]
    for c in res["cases"]:  # run_phases waits for every channel's every message
        runs = [r for kind in logtopic.KINDS for r in c["runs"][kind]]
        assert [(r["messages"], r["client_processes_failed"]) for r in runs] == [(30_000, 0)] * 2
    rows = logtopic.targets(res)
    assert [r[1].split(",")[0] for r in rows] == [
        "publish", "fan-out to 4 channels", "fan-out to 4 channels"]
    assert "default memory" in rows[2][1] and rows[2][3] == f"{res['cases'][2]['ratio_out']:.2f}"
