"""A served model's `config.json`, read from the GPU host's disk, for its KV geometry.

Servers report the model path they loaded, not the model's shape. Where kvpilot runs on the GPU
host, that path is a local directory or a Hugging Face hub id whose files sit in the hub cache
(`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, as `huggingface_hub`
lays it out: `models--ORG--NAME/snapshots/REVISION/config.json`). Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class ModelConfigReader(Protocol):
    def read(self, model_path: str) -> Mapping[str, Any] | None: ...


def hub_cache(env: Mapping[str, str]) -> Path:
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    return Path(env.get("HOME", "~")).expanduser() / ".cache" / "huggingface" / "hub"


class LocalModelConfigs:
    """Reads config.json from a model directory or the hub cache; None where neither has it."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)

    def candidates(self, model_path: str) -> list[Path]:
        found = [Path(model_path).expanduser() / "config.json"]
        if model_path.count("/") == 1 and not model_path.startswith(("/", ".")):
            repo = hub_cache(self.env) / ("models--" + model_path.replace("/", "--"))
            # the revision refs/main names first (what a plain download serves), then any other
            try:
                main = (repo / "refs" / "main").read_text().strip()
            except OSError:
                main = ""
            if main:
                found.append(repo / "snapshots" / main / "config.json")
            found += sorted((repo / "snapshots").glob("*/config.json"))
        return found

    def read(self, model_path: str) -> Mapping[str, Any] | None:
        for path in self.candidates(model_path):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                return data
        return None
