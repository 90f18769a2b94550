"""RESULTS.md and the plots from a small set of results."""

import json

from nsqshm.bench import report

MACHINE = {"cpu": "Test CPU", "cpus": 2, "mem_gib": 4.0, "kernel": "6.0", "python": "3.11",
           "revision": "abc1234", "loadavg": 0.5, "date": "2026-01-01 00:00:00 +0000",
           "steal_share": 0.01}
SERVER = {"kind": "nsqshm start, a fresh one per run"}


def _tcp():
    run = {"messages": 1000, "size": 200, "batch": 200, "rdy": 2500, "publishers": 2,
           "consumers": 2, "channels": 1, "in_msgs_per_s": 900e3, "out_msgs_per_s": 800e3,
           "server_cpu_us_per_msg_in": 0.8, "server_cpu_us_per_msg_out": 0.5}
    sizes = [{"size": s, "messages": 1000, "batch": 200, "in_msgs_per_s": 1e6 / s * 100,
              "out_msgs_per_s": 2e6 / s * 100, "in_MB_per_s": 100.0, "out_MB_per_s": 200.0,
              "raw_in_msgs_per_s": 3e6 / s * 100, "raw_out_msgs_per_s": 4e6 / s * 100,
              "ratio_in": 0.3, "ratio_out": 0.5} for s in (100, 1000, 10000)]
    median = {**run, "raw_in_msgs_per_s": 2e6, "raw_out_msgs_per_s": 3e6,
              "ratio_in_vs_raw_socket": 0.45, "ratio_out_vs_raw_socket": 0.27}
    return {"params": {**run, "window": 4}, "runs": [run, run], "raw_socket": [run],
            "median": median, "sizes": sizes, "fanout": [{**run, "channels": 4}],
            "loadgen": {"alone_in_msgs_per_s": 2e6, "alone_out_msgs_per_s": 3e6,
                        "headroom_in": 2.2, "headroom_out": 3.7, "client_cpu_share_in": 0.1,
                        "client_cpu_share_out": 0.3}, "channel_after": None}


def _latency():
    def pct(x):
        return {"p50_us": x, "p99_us": 5 * x, "p999_us": 9 * x, "max_us": 10 * x,
                "samples": 5000, "missing": 0, "send_lag_p99_us": 80.0, "server_cpu_share": 0.3}

    rows = [{"mode": mode, "rate": rate, "seconds": 3, "server_runs": [pct(rate / 100)],
             "server": pct(rate / 100), "relay_runs": [pct(50)], "relay": pct(50)}
            for mode in ("pub", "mpub") for rate in (1000, 10000, 100000)]
    return {"params": {"rates": [1000, 10000, 100000], "modes": ["pub", "mpub"], "size": 200,
                       "rdy": 2500, "warmup": 0.5, "tick_us": 100},
            "timer_overshoot": {"p50_us": 60, "p99_us": 600, "p999_us": 3000}, "rates": rows}


def _workers():
    rows = [{"workers": n, "median": {"in_msgs_per_s": n * 6e5, "out_msgs_per_s": n * 5e5},
             "ratio_in_vs_1": float(n), "ratio_out_vs_1": float(n)} for n in (1, 2)]
    return {"params": {}, "workers": rows, "cross_worker_hop": {"skipped": "not yet"}}


def test_results_md_and_plots(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "tcp.md").write_text("What limits it: the server's one core.")
    suites = {"tcp": _tcp(), "latency": _latency(), "workers": _workers(),
              "spark": {"skipped": "nsqshm.spark is not built yet (issue 9)"}}
    for name, res in suites.items():
        res = {"suite": name, "command": "nsqshm bench all --out bench", "machine": MACHINE,
               "server": SERVER, "seconds": 1.0, **res}
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps(res))
    written = report.write(str(tmp_path))
    text = (tmp_path / "RESULTS.md").read_text()
    assert "    nsqshm bench all --out bench" in text
    assert "2 cores (Test CPU)" in text and "abc1234" in text
    assert "## nsqd over TCP" in text and "| publish (in), msg/s | 900 k | 900 k |" in text
    assert "What limits it: the server's one core." in text
    assert "| 6 | publish / consume with --workers 2 |" in text
    assert "not measured: nsqshm.spark is not built yet (issue 9)" in text
    assert "| pub | 100,000/s |" in text
    for plot in report.PLOTS:
        path = tmp_path / "plots" / plot
        assert str(path) in written
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
