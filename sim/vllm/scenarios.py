"""Scenarios for the vLLM twin, run in-process in simulated time (no HTTP, no sleeping).

`KV_BOUND` is the vLLM face of the incident: Llama-3.1-8B on one H100 left with a small share of
the GPU (`--gpu-memory-utilization 0.30 --max-model-len 16384`, as when a co-tenant holds the
rest), under the incident workload's long answers. The KV cache (~53K tokens) holds a fraction of
what 64 users in flight need, so requests wait and running ones are preempted and recomputed.
`KV_BOUND_FIXED` is the same load at vLLM's default utilization.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.request import Request
from sim.vllm.args import resolve
from sim.vllm.memory import plan_kv
from sim.vllm.runtime import scheduler_config
from sim.vllm.scheduler import Scheduler, StepStats
from sim.workload import make_profile

WARMUP_S = 10.0


@dataclass(frozen=True)
class Scenario:
    name: str
    args: tuple[str, ...]
    workload: str
    concurrency: int


KV_BOUND = Scenario(
    "llama-h100-kv-bound",
    (
        "--preset",
        "llama-3.1-8b-h100",
        "--gpu-memory-utilization",
        "0.30",
        "--max-model-len",
        "16384",
    ),
    "incident",
    64,
)
KV_BOUND_FIXED = Scenario(
    "llama-h100-kv-bound-fixed",
    (
        "--preset",
        "llama-3.1-8b-h100",
        "--gpu-memory-utilization",
        "0.92",
        "--max-model-len",
        "16384",
    ),
    "incident",
    64,
)


@dataclass
class Outcome:
    kv_cache_size_tokens: int
    preemptions: int
    finished: int
    generation_tokens: int
    max_waiting: int  # after the warm-up
    max_kv_usage: float
    sim_seconds: float

    @property
    def generation_throughput(self) -> float:
        return self.generation_tokens / self.sim_seconds if self.sim_seconds else 0.0


def run(scenario: Scenario, sim_seconds: float, seed: int = 0) -> Outcome:
    cfg = resolve([*scenario.args, "--seed", str(seed)])
    plan = plan_kv(cfg)
    peak = {"waiting": 0, "usage": 0.0}

    def watch(s: Scheduler, _: StepStats) -> None:
        if s.now > WARMUP_S:  # the first steps admit the initial burst a budget at a time
            peak["waiting"] = max(peak["waiting"], len(s.waiting))
        peak["usage"] = max(peak["usage"], s.kv_usage)

    sched = Scheduler(scheduler_config(cfg, plan), on_step=watch)
    profile = make_profile(scenario.workload, seed)
    finished = [0]

    def next_request(user: int) -> None:
        spec = profile.next_request(user)
        room = cfg.max_model_len - len(spec.input_ids)
        req = Request(
            f"u{user}-{finished[0]}", spec.input_ids, min(spec.max_new_tokens, room), sched.now
        )

        def done(r: Request, spec: object = spec, user: int = user) -> None:
            finished[0] += 1
            next_request(user)

        req.on_finish = done
        sched.submit(req)

    for user in range(scenario.concurrency):
        next_request(user)
    while sched.now < sim_seconds:
        if sched.step(sim_seconds) == 0.0:
            break
    c = sched.counters
    return Outcome(
        kv_cache_size_tokens=plan.kv_cache_size_tokens,
        preemptions=c.preemptions,
        finished=finished[0],
        generation_tokens=c.generation_tokens,
        max_waiting=int(peak["waiting"]),
        max_kv_usage=float(peak["usage"]),
        sim_seconds=sched.now,
    )
