"""`python -m sim.load`: a closed-loop load generator for any SGLang-compatible server.

It keeps `--concurrency` requests in flight for `--duration` seconds of wall time using a workload
profile (`sim.workload`), through SGLang's native `/generate` (token ids, `ignore_eos`, so every
request produces exactly the tokens the profile asked for) or `/v1/chat/completions`.

Against the twin, `--duration` is wall time; the server runs `time_scale` times faster, so a
60-second run covers `60 * time_scale` simulated seconds. The report converts rates to simulated
units when the server announces its time scale (`kvpilot_twin.time_scale` in server info); a real
SGLang server announces none and the scale is 1.

SIGTERM or SIGINT ends a run early and still prints its report, so a caller can keep the load
on for as long as something else takes (an experiment) and stop it then. `--timeline` adds when
each request finished (seconds after `started_at`, wall clock) and its output tokens, for rates
over a window the caller chooses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from sim import tokenizer
from sim.workload import PROFILES, RequestSpec, make_profile, profile_options


@dataclass
class LoadReport:
    url: str
    profile: str
    concurrency: int
    wall_seconds: float
    time_scale: float
    sent: int = 0
    completed: int = 0
    failed: int = 0
    cancelled_at_end: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    e2e_latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0  # wall clock (epoch seconds) when the clients started
    # ...and when the last of them ended: the run's span on the wall clock, read at its two ends
    # (started_at + wall_seconds mixes two clocks read at different instants)
    ended_at: float = 0.0
    # (seconds after started_at, output tokens) of every completed request, in order
    finished: list[tuple[float, int]] = field(default_factory=list)

    @property
    def sim_seconds(self) -> float:
        return self.wall_seconds * self.time_scale

    def summary(self, timeline: bool = False) -> dict[str, Any]:
        """Totals, rates and latency percentiles; with `timeline`, every request's finish."""
        lat = sorted(self.e2e_latencies)

        def pct(p: float) -> float | None:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None

        sim = max(self.sim_seconds, 1e-9)
        hidden = {"e2e_latencies"} if timeline else {"e2e_latencies", "finished"}
        out = {k: v for k, v in asdict(self).items() if k not in hidden}
        out.update(
            sim_seconds=round(self.sim_seconds, 2),
            completed_tokens_per_s=round(self.completion_tokens / sim, 2),
            requests_per_s=round(self.completed / sim, 4),
            cache_hit_fraction=round(self.cached_tokens / self.prompt_tokens, 4)
            if self.prompt_tokens
            else 0.0,
            e2e_latency_s={
                "mean": round(statistics.fmean(lat), 3) if lat else None,
                "p50": pct(0.5),
                "p90": pct(0.9),
                "p99": pct(0.99),
            },
        )
        return out


class LoadError(Exception):
    """The target cannot be load-tested (unreachable, not SGLang, unauthorised)."""


async def _probe(client: httpx.AsyncClient) -> float:
    """Check the server answers and read the twin's time scale if it announces one."""
    for path in ("/server_info", "/get_server_info"):
        try:
            resp = await client.get(path)
        except httpx.TransportError as exc:
            raise LoadError(f"cannot reach {client.base_url}: {exc}") from exc
        if resp.status_code == 401:
            raise LoadError("the server refused the API key (401); pass --api-key")
        if resp.status_code == 200:
            try:
                info = resp.json()
            except ValueError:
                raise LoadError(
                    f"{client.base_url}{path} did not return JSON: not SGLang?"
                ) from None
            twin = info.get("kvpilot_twin") if isinstance(info, dict) else None
            if isinstance(twin, dict) and isinstance(twin.get("time_scale"), (int, float)):
                return float(twin["time_scale"])
            return 1.0
    raise LoadError(f"{client.base_url} has neither /server_info nor /get_server_info: not SGLang?")


def _payload(spec: RequestSpec, api: str, model: str) -> tuple[str, dict[str, Any]]:
    if api == "chat":
        text = tokenizer.decode(spec.input_ids)
        return "/v1/chat/completions", {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": spec.max_new_tokens,
            "temperature": 0,
            "ignore_eos": spec.ignore_eos,
        }
    return "/generate", {
        "input_ids": list(spec.input_ids),
        "sampling_params": {
            "max_new_tokens": spec.max_new_tokens,
            "ignore_eos": spec.ignore_eos,
            "temperature": 0,
        },
    }


async def run_load(
    url: str,
    *,
    concurrency: int,
    profile: str,
    duration: float,
    api: str = "generate",
    api_key: str | None = None,
    seed: int = 0,
    model: str = "default",
    stop: asyncio.Event | None = None,
    options: dict[str, int] | None = None,
) -> LoadReport:
    """Keep `concurrency` requests in flight for `duration` wall seconds, or until `stop` is
    set, whichever comes first."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"),
        headers=headers,
        limits=limits,
        timeout=httpx.Timeout(None, connect=10.0),
    ) as client:
        scale = await _probe(client)
        prof = make_profile(profile, seed, **(options or {}))
        report = LoadReport(url, profile, concurrency, 0.0, scale, started_at=time.time())
        start = time.monotonic()
        deadline = start + duration

        async def user(uid: int) -> None:
            while time.monotonic() < deadline:
                spec = prof.next_request(uid)
                path, body = _payload(spec, api, model)
                report.sent += 1
                try:
                    resp = await client.post(path, json=body)
                except httpx.TransportError as exc:
                    report.failed += 1
                    key = type(exc).__name__
                    report.errors[key] = report.errors.get(key, 0) + 1
                    await asyncio.sleep(0.2)
                    continue
                if resp.status_code != 200:
                    report.failed += 1
                    key = f"HTTP {resp.status_code}"
                    report.errors[key] = report.errors.get(key, 0) + 1
                    await asyncio.sleep(0.2)
                    continue
                data = resp.json()
                done_at = round(time.monotonic() - start, 3)
                report.completed += 1
                before = report.completion_tokens
                report.prompt_tokens += len(spec.input_ids)
                output_ids: list[int] = []
                if api == "chat":
                    usage = data.get("usage") or {}
                    report.completion_tokens += int(usage.get("completion_tokens", 0))
                    details = usage.get("prompt_tokens_details") or {}
                    report.cached_tokens += int(details.get("cached_tokens") or 0)
                else:
                    meta = data.get("meta_info") or {}
                    report.completion_tokens += int(meta.get("completion_tokens", 0))
                    report.cached_tokens += int(meta.get("cached_tokens", 0))
                    if isinstance(meta.get("e2e_latency"), (int, float)):
                        report.e2e_latencies.append(float(meta["e2e_latency"]))
                    output_ids = [int(x) for x in data.get("output_ids") or []]
                report.finished.append((done_at, report.completion_tokens - before))
                prof.completed(uid, spec, output_ids)

        tasks = [asyncio.create_task(user(i)) for i in range(concurrency)]
        await _until(deadline, stop)
        for t in tasks:
            if not t.done():
                report.cancelled_at_end += 1
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        report.wall_seconds = time.monotonic() - start
        report.ended_at = time.time()
        report.sent -= report.cancelled_at_end
        return report


async def _until(deadline: float, stop: asyncio.Event | None) -> None:
    """Sleep until the monotonic `deadline`, or until `stop` is set."""
    remaining = max(0.0, deadline - time.monotonic())
    if stop is None:
        await asyncio.sleep(remaining)
        return
    try:
        await asyncio.wait_for(stop.wait(), timeout=remaining)
    except TimeoutError:
        return


async def _run_until_signalled(**kwargs: Any) -> LoadReport:
    """`run_load`, ended early (with its report) by SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return await run_load(**kwargs, stop=stop)


def format_report(summary: dict[str, Any]) -> str:
    lat = summary["e2e_latency_s"]
    lines = [
        f"load on {summary['url']}: profile {summary['profile']}, concurrency "
        f"{summary['concurrency']}",
        f"  wall {summary['wall_seconds']:.1f} s = {summary['sim_seconds']:.1f} server s "
        f"(time scale {summary['time_scale']:g})",
        f"  completed {summary['completed']} requests ({summary['failed']} failed, "
        f"{summary['cancelled_at_end']} still running at the end)",
        f"  completed tokens/s {summary['completed_tokens_per_s']:.1f}, requests/s "
        f"{summary['requests_per_s']:.3f}, prefix-cache hit {summary['cache_hit_fraction']:.1%}",
    ]
    if lat["mean"] is not None:
        lines.append(
            f"  e2e latency (server) mean {lat['mean']:.2f} s, p50 {lat['p50']:.2f}, "
            f"p90 {lat['p90']:.2f}, p99 {lat['p99']:.2f}"
        )
    if summary["errors"]:
        lines.append(f"  errors: {summary['errors']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.load", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--profile", choices=sorted(PROFILES), default="incident")
    p.add_argument(
        "--profile-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set one of the profile's numbers, e.g. conversations=400 (repeatable)",
    )
    p.add_argument("--duration", type=float, required=True, help="wall seconds")
    p.add_argument("--api", choices=["generate", "chat"], default="generate")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--timeline",
        action="store_true",
        help="with --json: add `finished`, each request's finish time and output tokens",
    )
    ns = p.parse_args(argv)
    if ns.concurrency <= 0:
        p.error("--concurrency must be a positive integer")
    if ns.duration <= 0:
        p.error("--duration must be positive")
    if not ns.url.startswith(("http://", "https://")):
        p.error(f"--url must start with http:// or https://, got {ns.url!r}")
    try:
        options = profile_options(ns.profile_option)
        most = make_profile(ns.profile, ns.seed, **options).most_clients()
    except ValueError as exc:
        p.error(str(exc))
    if most is not None and ns.concurrency > most:
        p.error(
            f"--concurrency {ns.concurrency} is more clients than profile {ns.profile!r} can "
            f"serve at once ({most}): raise its option or lower --concurrency"
        )
    try:
        report = asyncio.run(
            _run_until_signalled(
                url=ns.url,
                concurrency=ns.concurrency,
                profile=ns.profile,
                duration=ns.duration,
                api=ns.api,
                api_key=ns.api_key,
                seed=ns.seed,
                options=options,
            )
        )
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = report.summary(timeline=ns.timeline)
    print(json.dumps(summary) if ns.json else format_report(summary), flush=True)
    return 0 if report.completed or report.cancelled_at_end else 1


if __name__ == "__main__":
    sys.exit(main())
