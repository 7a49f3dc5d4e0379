"""Reading the shipped unit files the way systemd does, for the deployment tests."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def unit_settings(path: Path) -> dict[str, list[str]]:
    """Every `Key=value` of a unit file, by key (a key may repeat), comments left out."""
    settings: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a setting: {raw!r}"
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def one(settings: dict[str, list[str]], key: str) -> str:
    values = settings.get(key, [])
    assert len(values) == 1, f"{key}: expected one value, got {values}"
    return values[0]
