"""SGLang's HTTP API on Starlette, per dialect (see `sim.version`)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sim import server_state, tokenizer
from sim.engine import synthetic_output
from sim.request import answer_drifts, greedy_output
from sim.runtime import Pending, Runtime
from sim.server_requests import ApiError, ids_batch, int_param, json_body, openai_error

Handler = Callable[[Request], Awaitable[Response]]
DEFAULT_MAX_NEW_TOKENS = 128  # /generate: sampling/sampling_params.py `max_new_tokens = 128`
# /v1/completions: entrypoints/openai/protocol.py `CompletionRequest.max_tokens: int = 16`
DEFAULT_COMPLETION_TOKENS = 16


def health_generates(path: str) -> bool:
    """Whether SGLang's health endpoint at `path` runs a generation (0.5.23
    `entrypoints/http_server.py`: `/health_generate` always; `/health` unless
    SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is false, `environ.py` EnvBool)."""
    if path == "/health_generate":
        return True
    value = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").lower()
    return value not in ("false", "0", "no", "n")


def health_check_timeout_s() -> float:
    """SGLANG_HEALTH_CHECK_TIMEOUT, 20 s by default (`HEALTH_CHECK_TIMEOUT`)."""
    try:
        return float(int(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")))
    except ValueError:
        return 20.0


class TwinApp:
    """Builds the Starlette app for one runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.cfg = rt.cfg
        self.version = rt.cfg.version

    # ----------------------------------------------------------------- app
    def build(self) -> Starlette:
        v = self.version
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/health_generate", self.health, methods=["GET"]),
            Route(
                "/get_server_info",
                self._deprecated(self.server_info, "/server_info"),
                methods=["GET"],
            ),
            Route(
                "/get_model_info", self._deprecated(self.model_info, "/model_info"), methods=["GET"]
            ),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/generate", self.generate, methods=["POST", "PUT"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
            Route("/abort_request", self.abort_request, methods=["POST"]),
        ]
        if v.new_endpoints:
            routes += [
                Route("/server_info", self.server_info, methods=["GET"]),
                Route("/model_info", self.model_info, methods=["GET"]),
                Route("/v1/loads", self.loads, methods=["GET"]),
            ]
        if not v.refactored:
            routes.append(Route("/get_load", self.get_load, methods=["GET"]))
        else:
            routes.append(Route("/ready", self.ready, methods=["GET"]))
        if self.cfg.server_args["enable_metrics"]:
            routes.append(Route("/metrics", self.metrics, methods=["GET"]))
        middleware = [Middleware(BaseHTTPMiddleware, dispatch=self._middleware)]
        return Starlette(routes=routes, middleware=middleware)

    async def _middleware(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        key = self.cfg.server_args["api_key"]
        path = request.url.path
        if (
            key
            and request.method != "OPTIONS"
            and not path.startswith("/health")
            and not path.startswith("/metrics")
            and request.headers.get("Authorization") != f"Bearer {key}"
        ):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        self.rt.metrics.http(request.method, path, None)
        response = await call_next(request)
        self.rt.metrics.http(request.method, path, response.status_code)
        return response

    def _deprecated(self, handler: Handler, new_path: str) -> Handler:
        if not self.version.new_endpoints:
            return handler

        async def wrapped(request: Request) -> Response:
            self.rt.log.line(
                f"Endpoint '{request.url.path}' is deprecated and will be removed in a future "
                f"version. Please use '{new_path}' instead."
            )
            return await handler(request)

        return wrapped

    # ----------------------------------------------------------------- state
    async def health(self, request: Request) -> Response:
        if self.rt.status != "up":
            return Response(status_code=503)
        if self.rt.wedged and health_generates(request.url.path):
            # 0.5.23 `health_generate`: a one-token request, polled once a second for an answer
            # from the scheduler for SGLANG_HEALTH_CHECK_TIMEOUT s (20), then 503; `/ready`
            # asks none and answers 200 from a stuck server
            await asyncio.sleep(health_check_timeout_s())
            self.rt.log.line(
                "Health check failed. Server couldn't get a response from detokenizer for last "
                f"{health_check_timeout_s():g} seconds."
            )
            return Response(status_code=503)
        return Response(status_code=200)

    async def ready(self, request: Request) -> Response:
        if self.rt.status != "up":
            return JSONResponse({"status": "not ready"}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def server_info(self, request: Request) -> Response:
        return JSONResponse(server_state.server_info(self.rt))

    async def model_info(self, request: Request) -> Response:
        return JSONResponse(server_state.model_info(self.rt))

    async def models(self, request: Request) -> Response:
        sa = self.cfg.server_args
        card = {
            "id": sa["served_model_name"],
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": sa["served_model_name"],
            "max_model_len": self.cfg.context_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def get_load(self, request: Request) -> Response:
        return JSONResponse(server_state.get_load(self.rt))

    async def loads(self, request: Request) -> Response:
        include = set(request.query_params.get("include", "core").split(","))
        ranks = range(len(self.rt.engines))
        dp = request.query_params.get("dp_rank")
        if dp is not None:
            if not dp.isdigit() or int(dp) >= len(self.rt.engines):
                return JSONResponse({"error": f"invalid dp_rank {dp!r}"}, status_code=400)
            ranks = range(int(dp), int(dp) + 1)
        loads = [server_state.rank_load(self.rt, r, include) for r in ranks]
        if request.query_params.get("format") == "prometheus":
            return PlainTextResponse(server_state.loads_prometheus(loads))
        return JSONResponse(server_state.loads_body(self.rt, loads))

    async def metrics(self, request: Request) -> Response:
        return Response(
            self.rt.metrics.exposition(),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    async def flush_cache(self, request: Request) -> Response:
        if all(e.flush_cache() for e in self.rt.engines):
            self.rt.log.line("Cache flushed successfully!")
            return PlainTextResponse(
                "Cache flushed.\nPlease check backend logs for more details. (When there are "
                "running or waiting requests, the operation will not be performed.)\n"
            )
        self.rt.log.line("Cache not flushed because there are pending requests.")
        return PlainTextResponse("Cache not flushed.\n", status_code=400)

    async def abort_request(self, request: Request) -> Response:
        body = await json_body(request)
        rid = body.get("rid")
        if not isinstance(rid, str):
            return JSONResponse({"error": "rid must be a string"}, status_code=400)
        self.rt.abort(rid)
        return Response(status_code=200)

    # ----------------------------------------------------------------- inference
    def _check_lengths(self, n_input: int, max_new: int) -> None:
        if n_input == 0:
            raise ApiError(400, "The input is empty: send `text` or `input_ids`.")
        limit = self.cfg.max_req_input_len
        if n_input > limit:
            raise ApiError(
                400,
                f"The input ({n_input} tokens) is longer than the model's context length "
                f"({self.cfg.context_len} tokens).",
            )
        if n_input + max_new > self.cfg.context_len:
            raise ApiError(
                400,
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.cfg.context_len} tokens. You requested a total of {n_input + max_new} "
                f"tokens: {n_input} tokens from the input messages and {max_new} tokens for the "
                "completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit.",
            )

    def _start(
        self,
        input_ids: tuple[int, ...],
        max_new: int,
        stream: bool,
        rid: str | None,
        ignore_eos: bool,
        priority: int | None = None,
    ) -> Pending:
        if self.rt.status not in {"up", "warming"}:
            raise ApiError(503, "The server is not ready.")
        self._check_lengths(len(input_ids), max_new)
        return self.rt.submit(
            input_ids, max_new, stream=stream, rid=rid, ignore_eos=ignore_eos, priority=priority
        )

    async def _wait(self, pending: Pending, request: Request) -> None:
        """Wait until the request finishes; abort it if the client goes away."""
        while not pending.done:
            pending.event.clear()
            try:
                await asyncio.wait_for(pending.event.wait(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():
                    self.rt.abort(pending.req.rid)
                    return
            if self.rt.status == "dead":
                raise ApiError(500, "The server died.")

    async def _progress(self, pending: Pending) -> AsyncIterator[tuple[int, int]]:
        """Yield (tokens visible before, tokens visible now) as the request streams."""
        seen = 0
        while True:
            pending.event.clear()
            if pending.delivered_out > seen:
                before, seen = seen, pending.delivered_out
                yield before, seen
            if pending.done:
                return
            if self.rt.status == "dead":
                return
            await pending.event.wait()

    def _meta(self, pending: Pending) -> dict[str, Any]:
        r = pending.req
        done = r.finished_at is not None
        finish: dict[str, Any] | None = None
        if done:
            if r.finish_reason == "abort":
                finish = {"type": "abort", "message": "The request was aborted."}
            elif r.finish_reason == "stop":
                finish = {"type": "stop", "matched": 2}
            else:
                finish = {"type": "length", "length": r.out_len}
        meta: dict[str, Any] = {
            "id": r.rid,
            "finish_reason": finish,
            "prompt_tokens": len(r.input_ids),
            "completion_tokens": pending.delivered_out,
            "cached_tokens": r.cached_tokens,
            "e2e_latency": round((r.finished_at or self.rt.sim_now) - r.arrival, 6),
        }
        if r.admitted_at is not None:
            meta["queue_time"] = round(r.admitted_at - r.arrival, 6)
        if self.version.refactored:
            meta["cached_tokens_details"] = {"device": r.cached_device, "host": r.cached_host}
        return meta

    async def generate(self, request: Request) -> Response:
        try:
            body = await json_body(request)
            params = body.get("sampling_params") or {}
            if not isinstance(params, dict):
                raise ApiError(400, "sampling_params must be an object")
            max_new = int_param(
                params.get("max_new_tokens"), DEFAULT_MAX_NEW_TOKENS, "max_new_tokens"
            )
            stream = bool(body.get("stream", False))
            if "input_ids" in body and body["input_ids"] is not None:
                prompts = ids_batch(body["input_ids"])
            elif isinstance(body.get("text"), (str, list)):
                texts = body["text"] if isinstance(body["text"], list) else [body["text"]]
                prompts = [tuple(tokenizer.encode(str(t))) for t in texts]
            else:
                raise ApiError(400, "Either text or input_ids should be provided.")
            batch = isinstance(body.get("text"), list) or (
                isinstance(body.get("input_ids"), list)
                and body["input_ids"]
                and isinstance(body["input_ids"][0], list)
            )
            rid = body.get("rid") if isinstance(body.get("rid"), str) else None
            if stream and batch:
                raise ApiError(400, "Streaming is supported for a single prompt only.")
            ignore_eos = bool(params.get("ignore_eos", False))
            priority = body.get("priority")
            if priority is not None and (
                isinstance(priority, bool) or not isinstance(priority, int)
            ):
                raise ApiError(400, "priority must be an integer")
            pendings = [
                self._start(p, max_new, stream, None if batch else rid, ignore_eos, priority)
                for p in prompts
            ]
        except ApiError as exc:
            return JSONResponse({"error": {"message": exc.message}}, status_code=exc.status)
        if stream:
            return StreamingResponse(
                self._generate_stream(pendings[0]), media_type="text/event-stream"
            )
        try:
            for p in pendings:
                await self._wait(p, request)
        except ApiError as exc:
            return JSONResponse({"error": {"message": exc.message}}, status_code=exc.status)
        results = [self._generate_result(p) for p in pendings]
        return JSONResponse(results if batch else results[0])

    def _generate_result(self, p: Pending) -> dict[str, Any]:
        ids = synthetic_output(p.req.rid, p.delivered_out)
        return {"text": tokenizer.decode(ids), "output_ids": ids, "meta_info": self._meta(p)}

    async def _generate_stream(self, p: Pending) -> AsyncIterator[bytes]:
        try:
            async for _, now in self._progress(p):
                ids = synthetic_output(p.req.rid, now)
                chunk = {
                    "text": tokenizer.decode(ids),
                    "output_ids": ids,
                    "meta_info": self._meta(p),
                }
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            if not p.done:
                self.rt.abort(p.req.rid)

    async def chat_completions(self, request: Request) -> Response:
        return await self._openai(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._openai(request, chat=False)

    async def _openai(self, request: Request, chat: bool) -> Response:
        if "application/json" not in request.headers.get("content-type", ""):
            return openai_error(400, "Unsupported Media Type: Only 'application/json' is allowed")
        try:
            body = await json_body(request)
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise ApiError(400, "messages must be a non-empty list")
                prompt_ids = tuple(tokenizer.encode(tokenizer.apply_chat_template(messages)))
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
                    prompt_ids = tuple(int(x) for x in prompt)
                elif isinstance(prompt, str):
                    prompt_ids = tuple(tokenizer.encode(prompt))
                else:
                    raise ApiError(400, "prompt must be a string or a list of token ids")
            max_new = int_param(
                body.get("max_completion_tokens", body.get("max_tokens")),
                DEFAULT_COMPLETION_TOKENS
                if not chat
                else max(1, self.cfg.context_len - len(prompt_ids) - 1),
                "max_tokens",
            )
            max_new = min(max_new, max(1, self.cfg.context_len - len(prompt_ids)))
            stream = bool(body.get("stream", False))
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            pending = self._start(
                prompt_ids, max_new, stream, None, bool(body.get("ignore_eos", False))
            )
            pending.req.greedy = body.get("temperature") == 0
        except ApiError as exc:
            return openai_error(exc.status, exc.message)
        model = str(body.get("model") or self.cfg.server_args["served_model_name"])
        if stream:
            return StreamingResponse(
                self._openai_stream(pending, chat, model, include_usage),
                media_type="text/event-stream",
            )
        try:
            await self._wait(pending, request)
        except ApiError as exc:
            return openai_error(exc.status, exc.message)
        r = pending.req
        text = tokenizer.decode(self._answer(pending, pending.delivered_out))
        finish = r.finish_reason or "length"
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": None,
        }
        if chat:
            choice["message"] = {
                "role": "assistant",
                "content": text,
                "reasoning_content": None,
                "tool_calls": None,
            }
        else:
            choice["text"] = text
        return JSONResponse(
            {
                "id": r.rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": self._usage(pending),
            }
        )

    def _answer(self, p: Pending, n: int) -> list[int]:
        """The first `n` tokens of an OpenAI-compatible answer: per prompt when greedy (so the
        same prompt is answered alike, and under an 8-bit KV cache a `fp8_answer_drift` share
        of prompts differently), else per request. (`/generate` answers per request: its
        `output_ids` continue the twin's own multi-turn sessions, which its cache model reads.)"""
        r = p.req
        if not r.greedy:
            return synthetic_output(r.rid, n)
        fp8 = self.cfg.kv_dtype.startswith("fp8")
        drift = fp8 and answer_drifts(r.input_ids, self.cfg.fp8_answer_drift)
        return greedy_output(r.input_ids, n, drifted=drift)

    def _usage(self, p: Pending) -> dict[str, Any]:
        prompt = len(p.req.input_ids)
        details = (
            {"cached_tokens": p.req.cached_tokens}
            if self.cfg.server_args["enable_cache_report"]
            else None
        )
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + p.delivered_out,
            "completion_tokens": p.delivered_out,
            "prompt_tokens_details": details,
        }

    async def _openai_stream(
        self, p: Pending, chat: bool, model: str, include_usage: bool
    ) -> AsyncIterator[bytes]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())
        cid = uuid.uuid4().hex

        def chunk(delta_text: str | None, finish: str | None, first: bool = False) -> bytes:
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
            if chat:
                delta: dict[str, Any] = {}
                if first:
                    delta["role"] = "assistant"
                if delta_text is not None:
                    delta["content"] = delta_text
                choice["delta"] = delta
            else:
                choice["text"] = delta_text or ""
            body = {
                "id": cid,
                "object": kind,
                "created": created,
                "model": model,
                "choices": [choice],
            }
            return f"data: {json.dumps(body)}\n\n".encode()

        try:
            first = True
            async for before, now in self._progress(p):
                ids = self._answer(p, now)[before:]
                text = (" " if before else "") + tokenizer.decode(ids)
                yield chunk(text, None, first)
                first = False
            yield chunk(None, p.req.finish_reason or "length")
            if include_usage:
                usage = {
                    "id": cid,
                    "object": kind,
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": self._usage(p),
                }
                yield f"data: {json.dumps(usage)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            if not p.done:
                self.rt.abort(p.req.rid)
