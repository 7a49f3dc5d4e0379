"""kvpilot against the real vLLM 0.32.0 on CPU: a diagnosis and two experiments, each restart a
real `vllm serve` started by kvpilot's process launcher.

The server is KV-bound on purpose: `--kv-cache-memory-bytes 4M` holds 16 blocks of 128 tokens
(one is vLLM's null block, so 1,920 usable tokens), and 16 clients each send 384 prompt tokens
for 512 output tokens (`ignore_eos`), so two requests run and the rest wait or are preempted.
Quadrupling the KV bytes lets nine run: the tiny model's decode step costs about the same for
nine as for two, so throughput doubles (vLLM's own log: about 200 then 500 tok/s) and the gate
keeps it. A cap of four running requests (`max_num_seqs` 128 to 4) on that server, which then
runs nine, leaves most of the pool idle and slows it down: the gate reverts it. (A change with no
effect was the case here until runs read +8% to +17% from it after the restart, one of them
significantly: a 24 s trial cannot tell a change that does nothing from a small gain, so the
revert path is exercised by one that measurably hurts.)
"""

from __future__ import annotations

import io
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.cli import main
from tests.ports import free_port
from tests.twin_process import REPO

from .harness import MARKS

pytestmark = [*MARKS, pytest.mark.slow]

CLIENTS = 16
PROMPT, OUTPUT = 384, 512
BLOCK = 128  # the CPU backend's block size (fixtures/server_info.json)
BLOCK_BYTES = 256 * 1024  # 2 x 4 layers x 2 KV heads x 64 x 2 bytes per token, x 128 tokens


class Server:
    """The real server behind kvpilot's process launcher, its kvpilot.toml, and a load."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        command = [
            sys.executable, str(REPO / "tests" / "real_vllm" / "launch.py"),
            "--port", str(self.port), "--served-model-name", "tiny-llama",
            "--max-model-len", "1024", "--kv-cache-memory-bytes", "4M",
        ]  # fmt: skip
        self.config = tmp_path / "kvpilot.toml"
        self.config.write_text(
            # The warm-up floor covers a request's lifetime (16 clients at about 1 completion a
            # second: 16 s): until then the batch holds the restart's young requests, short
            # contexts of which more fit the pool, and reads faster than the server will run.
            # With a 10 s floor a fresh clone's run judged +15.8% (95% +3.1% .. +30.1%) over
            # the 12 s after it and kept the token budget that cannot help. A trial then needs
            # 30 completed requests after the floor, so 60 s, not less.
            "[gate]\nbaseline_s = 30\nbatch_s = 5\nscrape_s = 1\nwarmup_floor_s = 20\n"
            "max_trial_s = 60\n\n"
            f'[servers.real]\nurl = "{self.url}"\nengine = "vllm"\n'
            '[servers.real.launcher]\nkind = "process"\nready_timeout_s = 180\n'
            # under load vLLM aborts its requests on SIGTERM, then waits for their connections
            # to close, which the clients keep open: the kill after this many seconds ends it
            "stop_timeout_s = 2\n"
            f"command = {json.dumps(command)}\n"
        )
        self.stop_load = threading.Event()
        self.completed = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str, config: bool = True) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main([*args, *(["--config", str(self.config)] if config else [])], out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    def client(self, i: int) -> None:
        """One client: distinct prompts (no shared prefix), one request after another; the
        server is down while kvpilot restarts it, so errors are waited out."""
        body = {"model": "tiny-llama", "max_tokens": OUTPUT, "ignore_eos": True, "temperature": 0}
        with httpx.Client(base_url=self.url, timeout=httpx.Timeout(600, connect=5)) as http:
            n = 0
            while not self.stop_load.is_set():
                prompt = [10 + (i * 131 + n * 17 + j * 7) % 1000 for j in range(PROMPT)]
                n += 1
                try:
                    r = http.post("/v1/completions", json={**body, "prompt": prompt})
                    if r.status_code == 200:
                        self.completed += 1
                        continue
                except httpx.HTTPError:
                    pass
                self.stop_load.wait(0.5)

    def cache_config(self) -> dict[str, str]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
        return dict(part.split("=", 1) for part in line[line.index("{") + 1 : -1].split('",'))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("real-vllm"))
    code, _, err = s.cli("server", "start", "--server", "real")
    assert code == 0, err
    clients = [threading.Thread(target=s.client, args=(i,), daemon=True) for i in range(CLIENTS)]
    try:
        for t in clients:
            t.start()
        yield s
    finally:
        s.stop_load.set()
        s.cli("server", "stop", "--server", "real")  # ends the requests in flight too
        for t in clients:
            t.join(timeout=30)


def labels(server: Server) -> dict[str, Any]:
    return {k: v.strip('"') for k, v in server.cache_config().items()}


def test_a_kv_bound_real_server_is_diagnosed_kv_cache(server: Server) -> None:
    code, out, err = server.cli(
        "diagnose", "--server", server.url, "--window", "30", "--json", config=False
    )
    assert code == 0, err
    found = json.loads(out)
    assert found["engine"] == "vLLM" and found["version"].startswith("0.32.0"), found
    assert found["capacity"]["max_total_num_tokens"] == 15 * BLOCK  # the null block left out
    assert found["bottleneck"] == "kv_cache", found["evidence"]
    assert found["capacity"]["queued"] > 1.0
    assert found["retractions"] is not None and found["retractions"] > 0, found["evidence"]


def test_four_times_the_kv_cache_is_kept(server: Server) -> None:
    change = f"kv_cache_memory_bytes={16 * 1024 * 1024}"
    code, out, err = server.cli(
        "experiment", "--server", "real", "--set", change, "--yes", "--json"
    )
    result = json.loads(out)
    assert result["state"] == "kept", (result.get("rule"), result.get("reason"), err)
    assert code == 0
    assert result["effect"]["mean"] > 0.5, result["effect"]
    cache = labels(server)
    assert cache["kv_cache_memory_bytes"] == str(16 * 1024 * 1024)
    assert int(cache["num_gpu_blocks"]) == 16 * 1024 * 1024 // BLOCK_BYTES


def test_a_cap_below_what_the_pool_runs_is_reverted(server: Server) -> None:
    code, out, err = server.cli(
        "experiment", "--server", "real", "--set", "max_num_seqs=4", "--yes", "--json"
    )
    result = json.loads(out)
    assert result["state"] == "reverted", (result.get("rule"), result.get("reason"), err)
    assert code == result["exit_code"] == 3, err  # "not improved": the gate ruled a gain out
    assert result["outcome"] == "not_improved"
    assert result["effect"]["mean"] < -0.2, result["effect"]  # nine running against four
    cache = labels(server)
    assert cache["kv_cache_memory_bytes"] == str(16 * 1024 * 1024)  # the kept change stays
