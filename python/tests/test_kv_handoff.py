"""examples/kv_handoff at small size: prefill and decode processes through a
real redis-server, push and pull-with-release, with their faults."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EX = Path(os.environ.get("XFER_ROOT", Path(__file__).resolve().parents[2])) / "examples" / "kv_handoff" / "handoff.py"
SMALL = ["--layers", "3", "--blocks", "64", "--block-size", "8", "--heads", "2", "--head-dim", "32"]


def run_pair(redis_url, name, mode, transports, prefill_args=(), decode_args=(), dtype="fp16"):
    common = ["--redis", redis_url, "--mode", mode, "--transports", transports, "--dtype", dtype, *SMALL]
    pf = subprocess.Popen([sys.executable, str(EX), "prefill", "--node", "pf-" + name, *common, *prefill_args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(pf.stdout.readline())["ready"] == "pf-" + name
        dc = subprocess.run([sys.executable, str(EX), "decode", "--node", "dc-" + name, "--peer", "pf-" + name,
                             "--requests", "6", "--tokens", "30", "--timeout", "30", "--verbose", *common,
                             *decode_args], capture_output=True, text=True, timeout=60)
        out, pf_err = pf.communicate(timeout=30)
    finally:
        if pf.poll() is None:
            pf.kill()
            pf.wait()
    summary = _tagged(dc.stdout, "SUMMARY ", dc, out + "\n--- prefill stderr\n" + pf_err)
    prefill = _tagged(out, "PREFILL ", dc, out + "\n--- prefill stderr\n" + pf_err)
    return dc, summary, prefill


def _tagged(text, tag, dc, pf_out):
    """The JSON of text's first line starting with tag; a missing line fails
    with both processes' output (decode's stderr says why it stopped)."""
    for line in text.splitlines():
        if line.startswith(tag):
            return json.loads(line[len(tag):])
    raise AssertionError(f"no {tag.strip()} line; decode rc {dc.returncode}\n--- decode stdout\n"
                         f"{dc.stdout[-3000:]}\n--- decode stderr\n{dc.stderr[-3000:]}\n--- prefill stdout\n"
                         f"{pf_out[-4000:]}")


@pytest.mark.parametrize("mode,transports,dtype", [("push", "tcp", "fp16"), ("push", "ipc", "bf16"),
                                                   ("pull", "tcp", "bf16"), ("pull", "ipc", "fp16")])
def test_handoff(redis_url, node_name, mode, transports, dtype):
    dc, s, pf = run_pair(redis_url, node_name[:20], mode, transports, dtype=dtype)
    assert dc.returncode == 0, dc.stdout + dc.stderr
    assert s["done"] == 6 and s["failed"] == {} and s["transport"] == transports
    assert s["latency_ms_p50"] > 0 and s["latency_ms_p99"] >= s["latency_ms_p50"] and s["gbps"] > 0
    # Every request went through the visible states.
    for rid in range(6):
        assert f"request {rid}: waiting -> transferring" in dc.stdout
        assert f"request {rid}: transferring -> done" in dc.stdout
    assert pf["requests"] == 6
    assert pf["released"] == (6 if mode == "pull" else 0) and pf["aborted"] == 0


def test_push_reports_failed_blocks(redis_url, node_name):
    dc, s, pf = run_pair(redis_url, node_name[:20], "push", "tcp", prefill_args=["--bad-request", "2"])
    assert dc.returncode == 1 and s["done"] == 5
    fail = s["failed"]["2"]
    assert len(fail["blocks"]) == 1 and "ERANGE" in fail["why"]
    assert "request 2: transferring -> failed" in dc.stdout or "request 2: waiting -> failed" in dc.stdout


def test_pull_frees_blocks_without_release(redis_url, node_name):
    dc, s, pf = run_pair(redis_url, node_name[:20], "pull", "tcp", prefill_args=["--abort-ms", "300"],
                         decode_args=["--skip-release", "4"])
    assert dc.returncode == 0 and s["done"] == 6
    assert pf == {"requests": 6, "released": 5, "aborted": 1}


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="no CUDA device (torch)")
@pytest.mark.parametrize("mode,transports", [("push", "ipc"), ("pull", "ipc"), ("push", "tcp"), ("pull", "tcp")])
def test_handoff_cuda(redis_url, node_name, mode, transports):
    dev = ["--device", "cuda"]
    dc, s, pf = run_pair(redis_url, node_name[:20], mode, transports, prefill_args=dev, decode_args=dev, dtype="bf16")
    assert dc.returncode == 0, dc.stdout + dc.stderr
    assert s["done"] == 6 and s["failed"] == {} and s["device"] == "cuda" and s["transport"] == transports
