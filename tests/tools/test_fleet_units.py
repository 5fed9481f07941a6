"""The fleet's parts that need no server process: a replica's command line, GPU groups, the merged /metrics,
the wait for a replica's /health."""

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tpserve.cli import build_parser
from tpserve.engine.tp.launch import free_port
from tpserve.tools.fleet.cli import fleet_wanted, local_replicas
from tpserve.tools.fleet.metrics import merge, render
from tpserve.tools.fleet.replica import (Replica, ReplicaError, gpu_groups, replica_argv, snapshots_wanted,
                                         wait_healthy)
from tpserve.tools.fleet.router import RouterError, make_router


def parse(*argv):
    return build_parser().parse_args(["serve", *argv])


def test_replica_argv_keeps_engine_and_serve_flags():
    args = parse("/m", "-dp", "3", "--tp", "2", "--kv-cache-memory", "8MiB", "--no-async-scheduling",
                 "--served-model-name", "a", "b", "--drain-timeout", "7", "--port", "9000", "--api-key", "K")
    argv = replica_argv(args, 4321)
    assert argv[2:5] == ["tpserve.cli", "serve", "/m"]
    joined = " ".join(argv)
    for part in ("--tp 2", "--kv-cache-memory 8MiB", "--no-async-scheduling", "--served-model-name a b",
                 "--drain-timeout 7.0", "--host 127.0.0.1 --port 4321", "--snapshot"):
        assert part in joined, part
    assert "9000" not in joined and "-dp" not in argv and "K" not in argv  # the key goes by environment
    assert "--no-snapshot" in replica_argv(parse("/m", "--no-snapshot"), 1)
    assert replica_argv(parse("/m", "--no-snapshot"), 1).count("--snapshot") == 0
    assert "--snapshot" not in replica_argv(parse("/m", "--load-format", "dummy"), 1)  # random weights: if asked
    assert "--snapshot" in replica_argv(parse("/m", "--load-format", "dummy", "--snapshot"), 1)
    assert "--snapshot" not in replica_argv(parse("/m"), 1, snapshots=False)  # e.g. TPSERVE_SNAPSHOT=0
    assert [snapshots_wanted(s, f) for s, f in ((None, "auto"), (None, "dummy"), (True, "dummy"), (False, "auto"))] \
        == [True, False, True, False]


def test_local_replicas():
    assert not fleet_wanted(parse())
    assert local_replicas(parse("-dp", "2")) == 2 and fleet_wanted(parse("--data-parallel-size", "2"))
    assert local_replicas(parse("--worker-urls", "http://a:1")) == 0  # a front router only
    assert local_replicas(parse("-dp", "1", "--worker-urls", "http://a:1")) == 1
    with pytest.raises(ValueError, match="data-parallel-size"):
        local_replicas(parse("-dp", "0"))


def test_gpu_groups(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert gpu_groups(2, 2, "auto") == [["4", "5"], ["6", "7"]]
    assert gpu_groups(4, 1, "cuda") == [["4"], ["5"], ["6"], ["7"]]
    assert gpu_groups(3, 1, "cpu") == [None] * 3
    with pytest.raises(ReplicaError, match="needs 6 GPUs; 4 are visible"):
        gpu_groups(3, 2, "auto")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,0")
    assert gpu_groups(2, 1, "cuda", 0.45) == [["0"], ["0"]]
    with pytest.raises(ReplicaError, match="GPU 0 is shared by 2 replicas.*pass at most 0.5"):
        gpu_groups(2, 1, "cuda", 0.85)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_groups(2, 1, "auto") == [None, None]
    with pytest.raises(ReplicaError, match="no GPU"):
        gpu_groups(2, 1, "cuda")


def test_metrics_merge_labels_every_sample():
    one = ("# HELP tpserve:request_success_total Finished requests\n# TYPE tpserve:request_success_total counter\n"
           'tpserve:request_success_total{finished_reason="stop"} 3.0\n'
           "# HELP tpserve:num_requests_running Running\n# TYPE tpserve:num_requests_running gauge\n"
           "tpserve:num_requests_running 1.0\n")
    two = one.replace("3.0", "5.0").replace("running 1.0", "running 0.0")
    text = render(merge({"0": one, "1": two})).decode()
    assert text.count("# TYPE tpserve:request_success_total counter") == 1  # one family, not one per replica
    assert 'tpserve:request_success_total{finished_reason="stop",replica="0"} 3.0' in text
    assert 'tpserve:request_success_total{finished_reason="stop",replica="1"} 5.0' in text
    assert 'tpserve:num_requests_running{replica="1"} 0.0' in text


def test_vllm_router_power_of_two_is_refused():
    with pytest.raises(RouterError, match="power_of_two"):
        make_router("vllm-router", "127.0.0.1", 1, "power_of_two", None, "error")


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_wait_healthy_answers_exits_and_times_out():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_healthy(Replica(0, server.server_address[1], None, proc=sleeper), 10)  # /health answers 200
        with pytest.raises(ReplicaError, match="replica 1 was not healthy within 1 s"):
            wait_healthy(Replica(1, free_port(), None, proc=sleeper), 1)  # nothing listens there
    finally:
        sleeper.kill()
        sleeper.wait()
        server.shutdown()
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    gone.wait()
    with pytest.raises(ReplicaError, match=r"replica 2 exited \(code 3\) before it was healthy"):
        wait_healthy(Replica(2, free_port(), None, proc=gone), 10)
