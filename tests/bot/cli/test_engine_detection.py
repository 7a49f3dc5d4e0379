"""A server configured without `engine` is served by whichever engine answers; one configured
with the wrong engine is told the right one. Against the vLLM twin, as a vLLM server that the
Quick start's configuration (which names no engine) describes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bot.cli import main
from sim.models import LLAMA_3_1_8B, write_model_dir
from tests.paths import REPO
from tests.ports import free_port


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = write_model_dir(LLAMA_3_1_8B, tmp_path_factory.mktemp("models") / "llama")
    port = free_port()
    twin = subprocess.Popen(
        [sys.executable, "-m", "sim.vllm", "serve", str(model), "--preset", "llama-3.1-8b-h100",
         "--port", str(port), "--time-scale", "100"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the vLLM twin did not start"
            time.sleep(0.2)
        yield url
    finally:
        twin.terminate()
        twin.wait(timeout=30)


def config(tmp_path: Path, url: str, engine: str = "") -> Path:
    path = tmp_path / "kvpilot.toml"
    path.write_text(f'[servers.kimi]\nurl = "{url}"\n{engine}')
    return path


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_doctor_finds_vllm_without_an_engine_key(tmp_path: Path, vllm_url: str) -> None:
    _, out, _ = cli("doctor", "--config", str(config(tmp_path, vllm_url)), "--json")
    report = json.loads(out)
    server = [c for c in report["checks"] if c["area"] == "server kimi"]
    assert server and all(c["ok"] for c in server), server
    assert "vLLM" in server[0]["detail"], server


def test_a_wrong_engine_is_named_with_the_fix(tmp_path: Path, vllm_url: str) -> None:
    path = config(tmp_path, vllm_url, 'engine = "sglang"\n')
    code, out, _ = cli("doctor", "--config", str(path), "--json")
    assert code == 1
    failed = [c for c in json.loads(out)["checks"] if not c["ok"] and c["area"] == "server kimi"]
    assert failed and "this is vLLM" in failed[0]["detail"], failed
    assert failed[0]["fix"] == 'set engine = "vllm" in [servers.kimi]', failed


def test_an_experiment_offers_the_engine_that_answers(tmp_path: Path, vllm_url: str) -> None:
    """Asked for an argument only SGLang has, the answer lists vLLM's arguments."""
    launcher = '[servers.kimi.launcher]\nkind = "process"\ncommand = ["vllm", "serve", "m"]\n'
    path = config(tmp_path, vllm_url, launcher)
    code, _, err = cli(
        "experiment", "--server", "kimi", "--set", "mem_fraction_static=0.9", "--config", str(path)
    )
    assert code == 2, err
    assert "gpu_memory_utilization" in err and "mem_fraction_static" in err, err
