"""kvpilot's own image (deploy/docker/Dockerfile, built by `make bot-image`) run on the real
Docker Engine as docs/operations.md runs it: its entrypoint, its user, its volume for the
database, its health check. The Slack Web API is the local Slack-compatible server and the
server it watches the twin, both on this host's loopback (the container shares its network).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
from slack_sdk.signature import SignatureVerifier

from tests.ports import free_port
from tests.real_daemons.bot_image import IMAGE, IMAGE_TAR
from tests.real_daemons.dockerd import Dockerd, unavailable
from tests.real_daemons.systemd_box import docker
from tests.slackfake import FakeSlack
from tests.twin_process import running_twin

pytestmark = pytest.mark.real_daemons

SECRET = "image-signing-secret"
TWIN = ["--preset", "llama-3.1-8b-h100", "--time-scale", "200", "--enable-metrics"]
CONFIG = """[kvpilot]
database = "/var/lib/kvpilot/kvpilot.db"
time_scale = 200

[access]
approvers = ["U0123ALICE"]
operators = ["U0123ALICE"]

[slack]
channels = ["C0123OPS"]

[servers.kimi]
url = "{url}"
"""


@pytest.fixture(scope="module")
def image(dockerd: Dockerd) -> str:
    if not IMAGE_TAR.exists():
        unavailable(f"{IMAGE_TAR} is not built: run `make bot-image` (it needs the network)")
    loaded = docker(dockerd, "load", "-i", str(IMAGE_TAR), timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    return IMAGE


@pytest.fixture
def bot(image: str, dockerd: Dockerd, tmp_path: Path) -> Iterator[tuple[str, int, FakeSlack]]:
    port = free_port()
    name, volume = f"kvpilot-bot-{port}", f"kvpilot-data-{secrets.token_hex(4)}"
    with FakeSlack() as slack, running_twin(TWIN) as twin:
        config = tmp_path / "kvpilot.toml"
        config.write_text(CONFIG.format(url=twin.url))
        config.chmod(0o644)
        started = docker(
            dockerd, "run", "-d", "--name", name, "--network", "host",
            "-e", "SLACK_BOT_TOKEN=xoxb-test", "-e", f"SLACK_SIGNING_SECRET={SECRET}",
            "-e", f"SLACK_API_URL={slack.api_url}",
            "-e", f"KVPILOT_HEALTH_URL=http://127.0.0.1:{port}/healthz",
            "--health-interval", "1s", "--health-start-period", "60s",
            "-v", f"{config}:/etc/kvpilot/kvpilot.toml:ro", "-v", f"{volume}:/var/lib/kvpilot",
            image, "serve", "--config", "/etc/kvpilot/kvpilot.toml", "--host", "127.0.0.1",
            "--port", str(port),
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        try:
            yield name, port, slack
        finally:
            docker(dockerd, "rm", "-f", name)
            docker(dockerd, "volume", "rm", "-f", volume)


def inspect(dockerd: Dockerd, name: str, template: str) -> str:
    return docker(dockerd, "inspect", "-f", template, name).stdout.strip()


def test_the_image_serves_passes_its_health_check_and_stops_cleanly(
    bot: tuple[str, int, FakeSlack], dockerd: Dockerd
) -> None:
    name, port, slack = bot
    deadline = time.monotonic() + 90
    while inspect(dockerd, name, "{{.State.Health.Status}}") != "healthy":
        state = inspect(dockerd, name, "{{.State.Status}}")
        logs = docker(dockerd, "logs", "--tail", "40", name)
        assert state == "running", logs.stdout + logs.stderr
        assert time.monotonic() < deadline, logs.stdout + logs.stderr
        time.sleep(0.5)
    health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
    assert health.status_code == 200, health.text

    # a signed slash command through the image's Bolt app
    body = urlencode(
        {"command": "/kvpilot", "text": "help", "user_id": "U0123ALICE", "team_id": "T1",
         "channel_id": "C0123OPS", "response_url": slack.response_url("help"), "trigger_id": "1"}
    )  # fmt: skip
    ts = str(int(time.time()))
    signature = SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)
    assert signature is not None
    answer = httpx.post(
        f"http://127.0.0.1:{port}/slack/events",
        content=body,
        headers={
            "content-type": "application/x-www-form-urlencoded",
            "x-slack-request-timestamp": ts,
            "x-slack-signature": signature,
        },
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    forged = httpx.post(
        f"http://127.0.0.1:{port}/slack/events", content=body, timeout=30,
        headers={"content-type": "application/x-www-form-urlencoded",
                 "x-slack-request-timestamp": ts, "x-slack-signature": "v0=" + "0" * 64},
    )  # fmt: skip
    assert forged.status_code == 401

    # the same checks from a shell in the container, and the database on the volume, owned by
    # the image's user
    doctor = docker(
        dockerd, "exec", name, "kvpilot", "doctor", "--config", "/etc/kvpilot/kvpilot.toml"
    )
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "FAIL" not in doctor.stdout and "server kimi" in doctor.stdout, doctor.stdout
    owner = docker(dockerd, "exec", name, "stat", "-c", "%u:%g", "/var/lib/kvpilot/kvpilot.db")
    assert owner.stdout.strip() == "10001:10001", owner.stdout + owner.stderr

    stopped = docker(dockerd, "stop", "-t", "30", name)
    assert stopped.returncode == 0, stopped.stderr
    assert inspect(dockerd, name, "{{.State.ExitCode}}") == "0", docker(dockerd, "logs", name)


def test_the_image_run_without_its_configuration_says_what_is_missing(
    image: str, dockerd: Dockerd
) -> None:
    done = docker(dockerd, "run", "--rm", "--network", "none", image)
    assert done.returncode not in (0, 125, 126, 127), done.stderr  # kvpilot's, not docker's
    said = done.stdout + done.stderr
    assert said.startswith("error: no configuration at /etc/kvpilot/kvpilot.toml: create it"), said
    assert "Traceback" not in said
