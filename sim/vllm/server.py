"""The vLLM twin's HTTP API (vLLM 0.32's OpenAI-compatible server, the parts the twin models).

Responses are whole (no streaming): `stream: true` is answered like a plain request.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sim.request import greedy_output
from sim.runtime import Pending
from sim.tokenizer import apply_chat_template, decode, encode
from sim.vllm.metrics import cache_config_fields
from sim.vllm.runtime import VllmRuntime

VLLM_VERSION = "0.32.0"  # vllm/_version.py of the release the twin speaks
# vllm/entrypoints/openai/completion/protocol.py: max_tokens defaults to 16 for completions
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# serve/middleware/authenticate.py:10: only these prefixes need the API key
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")

Handler = Callable[[Request], Awaitable[Response]]


class ApiError(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type

    def response(self) -> JSONResponse:
        return JSONResponse(
            {
                "error": {
                    "message": self.message,
                    "type": self.err_type,
                    "param": None,
                    "code": self.status,
                }
            },
            status_code=self.status,
        )


class VllmApp:
    def __init__(self, rt: VllmRuntime) -> None:
        self.rt = rt
        self.cfg = rt.cfg

    def build(self) -> Starlette:
        # The routes of tests/real_vllm/fixtures/routes.txt the twin models.
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/ping", self.health, methods=["GET", "POST"]),
            Route("/load", self.load, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/kv_event_sources", self.kv_event_sources, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/tokenize", self._api(self.tokenize), methods=["POST"]),
            Route("/v1/completions", self._api(self.completions), methods=["POST"]),
            Route("/v1/chat/completions", self._api(self.chat_completions), methods=["POST"]),
        ]
        if self.cfg.dev_mode:
            routes += [
                Route("/server_info", self.server_info, methods=["GET"]),
                Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),
                Route("/is_sleeping", self.is_sleeping, methods=["GET"]),
            ]
        for route in routes:
            # Starlette adds HEAD to every GET route; FastAPI's API routes answer only what they
            # declare (routes.txt lists HEAD for the documentation routes alone), so HEAD is 405
            assert route.methods is not None
            route.methods.discard("HEAD")
        middleware = [Middleware(BaseHTTPMiddleware, dispatch=self._auth)]
        return Starlette(
            routes=routes,
            middleware=middleware,
            exception_handlers={HTTPException: self._http_error},
        )

    @staticmethod
    async def _http_error(request: Request, exc: Exception) -> Response:
        """FastAPI's body for an unknown path or method: `{"detail":"Not Found"}`
        (tests/real_vllm/fixtures/probes.json, /get_server_info)."""
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    async def _auth(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        key = self.cfg.api_key
        if (
            key
            and request.method != "OPTIONS"
            and request.url.path.startswith(GUARDED_PREFIXES)
            and request.headers.get("Authorization") != f"Bearer {key}"
        ):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    @staticmethod
    def _api(handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as err:
                return err.response()

        return wrapped

    # ----------------------------------------------------------------- plain endpoints
    async def health(self, request: Request) -> Response:
        if self.rt.status == "dead":
            return Response(status_code=503)
        return Response(status_code=200)

    async def load(self, request: Request) -> Response:
        """`{"server_load": N}` (probes.json); N counts requests in flight only with
        --enable-server-load-tracking, which the twin does not model, so it stays 0."""
        return JSONResponse({"server_load": 0})

    async def kv_event_sources(self, request: Request) -> Response:
        """No KV event publisher configured: `{}` (probes.json)."""
        return JSONResponse({})

    async def is_sleeping(self, request: Request) -> Response:
        """Dev mode: the twin never sleeps (probes.json: `{"is_sleeping":false}`)."""
        return JSONResponse({"is_sleeping": False})

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": VLLM_VERSION})

    async def metrics(self, request: Request) -> Response:
        body = self.rt.metrics.exposition(
            self.rt.schedulers, vllm_families=not self.cfg.disable_log_stats
        )
        return Response(
            body,
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    async def models(self, request: Request) -> Response:
        created = int(time.time())
        card = {
            "id": self.cfg.served_model_name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": self.cfg.model,
            "parent": None,
            "max_model_len": self.cfg.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex[:16]}",  # models.json
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return JSONResponse({"object": "list", "data": [card]})

    def _config_sections(self) -> dict[str, dict[str, Any]]:
        """A subset of VllmConfig's sections and fields, each name as in the real
        `/server_info?config_format=json` (tests/real_vllm/fixtures/server_info.json)."""
        c = self.cfg
        return {
            "model_config": {
                "model": c.model,
                "tokenizer": c.model,
                "max_model_len": c.max_model_len,
                "enforce_eager": c.enforce_eager,
                "seed": c.seed,
                "served_model_name": c.served_model_name,
            },
            "cache_config": cache_config_fields(c, self.rt.plan),
            "parallel_config": {
                "pipeline_parallel_size": 1,
                "tensor_parallel_size": c.tensor_parallel_size,
                "data_parallel_size": c.data_parallel_size,
            },
            "scheduler_config": {
                "max_num_batched_tokens": c.max_num_batched_tokens,
                "max_num_seqs": c.max_num_seqs,
                "enable_chunked_prefill": True,
            },
            "compilation_config": {
                "mode": 0 if c.enforce_eager else 3,
                # None with --enforce-eager (server_info.json); else min(2 x max_num_seqs, 512)
                "max_cudagraph_capture_size": (
                    None if c.enforce_eager else min(2 * c.max_num_seqs, 512)
                ),
            },
        }

    def _config_text(self) -> str:
        """VllmConfig.__str__ (`config_format=text`, the default): `key=value, ...` in vLLM's
        order, the fields the twin models (tests/real_vllm/fixtures/server_info_text.json)."""
        c = self.cfg
        return (
            f"model={c.model!r}, speculative_config=None, tokenizer={c.model!r}, "
            f"skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
            f"tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
            f"max_seq_len={c.max_model_len}, download_dir=None, load_format=auto, "
            f"tensor_parallel_size={c.tensor_parallel_size}, pipeline_parallel_size=1, "
            f"data_parallel_size={c.data_parallel_size}, quantization=None, "
            f"enforce_eager={c.enforce_eager}, "
            f"kv_cache_dtype={c.kv_cache_dtype}, device_config=cuda, seed={c.seed}, "
            f"served_model_name={c.served_model_name}, "
            f"enable_prefix_caching={c.enable_prefix_caching}, enable_chunked_prefill=True"
        )

    async def server_info(self, request: Request) -> Response:
        """serve/dev/server_info/api_router.py (VLLM_SERVER_DEV_MODE=1 only)."""
        as_text = request.query_params.get("config_format", "text") == "text"
        c = self.cfg
        return JSONResponse(
            {
                "vllm_config": self._config_text() if as_text else self._config_sections(),
                # envs' parsed values (server_info.json: a bool and a float)
                "vllm_env": {
                    "VLLM_SERVER_DEV_MODE": True,
                    "VLLM_LOG_STATS_INTERVAL": c.log_stats_interval,
                },
                # collect_env's fields (server_info.json `system_env`, same names)
                "system_env": {
                    "is_cuda_available": "True",
                    "nvidia_gpu_models": f"GPU 0: {c.preset.base.gpu_name}",
                    "vllm_version": VLLM_VERSION,
                },
            }
        )

    async def reset_prefix_cache(self, request: Request) -> Response:
        for sched in self.rt.schedulers:
            sched.reset_prefix_cache()
        return JSONResponse({"success": True})  # probes.json

    async def tokenize(self, request: Request) -> Response:
        """serve/tokenize/protocol.py:157 (not under /v1, so not guarded by the API key)."""
        body = await self._json(request)
        if isinstance(body.get("messages"), list):
            text = apply_chat_template(body["messages"])
        else:
            text = str(body.get("prompt", ""))
        ids = encode(text)
        return JSONResponse(
            {
                "count": len(ids),
                "max_model_len": self.cfg.max_model_len,
                "tokens": ids,
                "token_strs": None,
            }
        )

    # ----------------------------------------------------------------- generation
    async def _json(self, request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(400, "Invalid JSON body") from None
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object")
        return body

    def _limits(self, n_prompt: int, max_tokens: Any) -> int:
        limit = self.cfg.max_model_len
        if n_prompt >= limit:
            # vllm/renderers/params.py:526-535
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {n_prompt} input tokens, which exceeds this limit even without any "
                "output tokens. Please reduce the length of the input prompt.",
            )
        room = limit - n_prompt
        if max_tokens is None:
            return room
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.")
        return min(int(max_tokens), room)

    async def _run(
        self, request: Request, ids: tuple[int, ...], max_tokens: int, ignore_eos: bool
    ) -> Pending:
        if self.rt.status != "up":
            raise ApiError(503, "The server is not ready.", "ServiceUnavailableError")
        pending = self.rt.submit(ids, max_tokens, ignore_eos=ignore_eos)
        while not pending.done:
            pending.event.clear()
            try:
                await asyncio.wait_for(pending.event.wait(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():  # vLLM aborts a request whose client left
                    self.rt.schedulers[pending.dp_rank].abort(pending.req.rid)
        return pending

    # Response shapes as recorded (tests/real_vllm/fixtures/completions.json): every key the
    # real server sends, null where the twin has nothing to say.
    @staticmethod
    def _usage(p: Pending) -> dict[str, Any]:
        n_in, n_out = len(p.req.input_ids), p.req.out_len
        return {
            "prompt_tokens": n_in,
            "total_tokens": n_in + n_out,
            "completion_tokens": n_out,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }

    @staticmethod
    def _answer(p: Pending, body: dict[str, Any]) -> str:
        """The answer's text: with temperature 0 a function of the prompt (greedy decoding
        answers a prompt alike each time), else of the request."""
        if body.get("temperature") == 0:
            return decode(greedy_output(p.req.input_ids, len(p.req.output_ids)))
        return decode(p.req.output_ids)

    def _fingerprint(self) -> str:
        """`vllm-<version>-<8 hex>` (completions.json)."""
        digest = hashlib.sha256(self.cfg.model.encode()).hexdigest()[:8]
        return f"vllm-{VLLM_VERSION}-{digest}"

    async def completions(self, request: Request) -> Response:
        body = await self._json(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = tuple(encode(prompt))
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = tuple(prompt)
        else:
            raise ApiError(400, "prompt must be a string or a list of token ids")
        if not ids:
            raise ApiError(400, "The prompt is empty")
        max_tokens = self._limits(len(ids), body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS))
        p = await self._run(request, ids, max_tokens, bool(body.get("ignore_eos", False)))
        return JSONResponse(
            {
                "id": p.req.rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.cfg.served_model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": self._answer(p, body),
                        "logprobs": None,
                        "finish_reason": p.req.finish_reason,
                        "stop_reason": None,
                        "token_ids": None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": None,
                        "routed_experts": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": self._fingerprint(),
                "usage": self._usage(p),
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        )

    async def chat_completions(self, request: Request) -> Response:
        body = await self._json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list")
        ids = tuple(encode(apply_chat_template(messages)))
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = self._limits(len(ids), max_tokens)
        p = await self._run(request, ids, max_tokens, bool(body.get("ignore_eos", False)))
        rid = p.req.rid.replace("cmpl-", "chatcmpl-", 1)
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.cfg.served_model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": self._answer(p, body),
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "reasoning": None,
                        },
                        "logprobs": None,
                        "finish_reason": p.req.finish_reason,
                        "stop_reason": None,
                        "token_ids": None,
                        "routed_experts": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": self._fingerprint(),
                "usage": self._usage(p),
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        )


__all__ = ["VLLM_VERSION", "VllmApp"]
