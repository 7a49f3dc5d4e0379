"""The vLLM twin's HTTP API (vLLM 0.32's OpenAI-compatible server, the parts the twin models).

Responses are whole (no streaming): `stream: true` is answered like a plain request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sim.runtime import Pending
from sim.tokenizer import apply_chat_template, decode, encode
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
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/ping", self.health, methods=["GET", "POST"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/tokenize", self._api(self.tokenize), methods=["POST"]),
            Route("/v1/completions", self._api(self.completions), methods=["POST"]),
            Route("/v1/chat/completions", self._api(self.chat_completions), methods=["POST"]),
        ]
        if self.cfg.dev_mode:
            routes += [
                Route("/server_info", self.server_info, methods=["GET"]),
                Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),
            ]
        middleware = [Middleware(BaseHTTPMiddleware, dispatch=self._auth)]
        return Starlette(routes=routes, middleware=middleware)

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

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": VLLM_VERSION})

    async def metrics(self, request: Request) -> Response:
        # --disable-log-stats: no stat loggers, so no vllm:* families (v1/engine/async_llm.py:195)
        body = b"" if self.cfg.disable_log_stats else self.rt.metrics.exposition(self.rt.scheduler)
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
                    "id": f"modelperm-{created}",
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

    async def server_info(self, request: Request) -> Response:
        """serve/dev/server_info/api_router.py (VLLM_SERVER_DEV_MODE=1 only)."""
        c = self.cfg
        config = {
            "model_config": {"model": c.model, "max_model_len": c.max_model_len},
            "cache_config": {
                "block_size": c.block_size,
                "gpu_memory_utilization": c.gpu_memory_utilization,
                "cache_dtype": c.kv_cache_dtype,
                "enable_prefix_caching": c.enable_prefix_caching,
                "num_gpu_blocks": self.rt.plan.num_gpu_blocks,
                "num_gpu_blocks_override": c.num_gpu_blocks_override,
                "kv_cache_memory_bytes": c.kv_cache_memory_bytes,
                "kv_cache_size_tokens": self.rt.plan.kv_cache_size_tokens,
            },
            "scheduler_config": {
                "max_num_seqs": c.max_num_seqs,
                "max_num_batched_tokens": c.max_num_batched_tokens,
                "enable_chunked_prefill": True,
            },
            "parallel_config": {"tensor_parallel_size": c.tensor_parallel_size},
            "compilation_config": {"mode": 0 if c.enforce_eager else 3},
        }
        as_text = request.query_params.get("config_format", "text") == "text"
        return JSONResponse(
            {
                "vllm_config": json.dumps(config) if as_text else config,
                "vllm_env": {"VLLM_SERVER_DEV_MODE": "1"},
                "system_env": {"gpu_type": c.preset.base.gpu_name},
            }
        )

    async def reset_prefix_cache(self, request: Request) -> Response:
        self.rt.scheduler.reset_prefix_cache()
        return Response(status_code=200)

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
                    self.rt.scheduler.abort(pending.req.rid)
        return pending

    @staticmethod
    def _usage(p: Pending) -> dict[str, Any]:
        n_in, n_out = len(p.req.input_ids), p.req.out_len
        return {
            "prompt_tokens": n_in,
            "total_tokens": n_in + n_out,
            "completion_tokens": n_out,
            "prompt_tokens_details": None,
        }

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
                        "text": decode(p.req.output_ids),
                        "logprobs": None,
                        "finish_reason": p.req.finish_reason,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                ],
                "usage": self._usage(p),
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
                            "content": decode(p.req.output_ids),
                            "refusal": None,
                            "tool_calls": [],
                            "reasoning_content": None,
                        },
                        "logprobs": None,
                        "finish_reason": p.req.finish_reason,
                        "stop_reason": None,
                    }
                ],
                "usage": self._usage(p),
            }
        )


__all__ = ["VLLM_VERSION", "VllmApp"]
