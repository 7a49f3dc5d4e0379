"""An experiment asked for on a GitOps-managed workload is refused before anything is recorded
or written, and the operator gets the patch to commit: `kvpilot experiment` against the fake
API server, with the twin running as the Deployment's pod."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.chat.approvals import not_started
from playbooks.launchers.gitops import ManagedByGitOps, commit_patch, managers
from playbooks.launchers.kube_objects import templates
from tests.playbooks.launchers.harness import deployment, kubernetes_harness
from tests.playbooks.launchers.test_gitops import marked
from tests.twin_process import REPO

TRACKING = {"argocd.argoproj.io/tracking-id": "llm:apps/Deployment:sglang/sglang"}


def managed(args: list[str], port: int) -> dict[str, Any]:
    return marked(deployment(args, port), annotations=TRACKING)


def test_an_experiment_on_a_gitops_managed_workload_is_refused_with_the_patch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with kubernetes_harness(tmp_path, monkeypatch, obj=managed) as h:
        cluster = h.extra["cluster"]
        writes = list(cluster.writes())
        done = subprocess.run(
            [sys.executable, "-m", "bot.cli", "experiment", "--server", "twin", "--set",
             "mem_fraction_static=0.88", "--yes", "--config", str(h.config)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "is managed by Argo CD Application llm" in done.stderr, done.stderr
        assert "next sync would undo the change" in done.stderr
        patch = json.loads(done.stderr[done.stderr.index("[") : done.stderr.rindex("]") + 1])
        (op,) = [o for o in patch if o["path"].endswith("/args")]
        assert op["path"] == "/spec/template/spec/containers/0/args"
        assert op["value"][op["value"].index("--mem-fraction-static") + 1] == "0.88"
        assert "Traceback" not in done.stderr
        assert cluster.writes() == writes  # nothing reached the API server
        assert h.info()["mem_fraction_static"] == 0.85
        listed = subprocess.run(
            [sys.executable, "-m", "bot.cli", "experiments", "list", "--config", str(h.config)],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0 and "twin" not in listed.stdout, listed.stdout


def test_in_chat_the_refusal_says_why_and_shows_the_patch_as_a_code_block() -> None:
    obj = managed(["--port", "1"], 1)
    patch = commit_patch(templates("Deployment", obj, "sglang", None), ["--port", "2"])
    said = not_started(ManagedByGitOps("Deployment sglang/sglang", managers(obj), patch))
    head, _, block = said.partition("\n```\n")
    assert head.startswith("Deployment sglang/sglang is managed by Argo CD Application llm")
    assert json.loads(block.removesuffix("\n```")) == patch
    assert not_started(ValueError("plain")) == "plain"
