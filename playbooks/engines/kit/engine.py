"""`EngineBase`: the engine interface (`base.Engine`) with a default for every member an engine
need not know about, so a new engine writes only what it alone knows; `TunedEngine` adds the
launch-argument and rules members of an engine kvpilot tunes, over the engine's own modules.

An engine supplies its name and label, its metrics (`MetricsSpec` and `snapshot`), its client
(`client`, or `open_client` where it takes retries, a clock or launch arguments),
`parse_settings` and its rules (`rules_for`). Everything else has a safe default: a read-only
engine (one kvpilot diagnoses but cannot restart or tune) changes no launch arguments, so each
member that would edit or read a command line refuses with an `ArgError` saying so; its exits
read as crashes with the log's last line; a stored sample is read back as the seam stores it.
An engine that can be tuned derives from `TunedEngine` instead, as SGLang and vLLM do: it names
its allow-list module (`arguments`), its rules (`engine_rules`), client (`api`) and signatures
modules, and the members that read them are written here once. Its HTTP client derives from
`EngineReader`, what SGLang's and vLLM's clients share.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from playbooks.engines import completions
from playbooks.engines.base import (
    ArgError,
    ArgReading,
    Engine,
    EngineClient,
    EngineError,
    LaunchArgs,
    Metrics,
    MetricsDisabled,
    MetricsSpec,
    Prompt,
    Rules,
    ServerSettings,
    Snapshot,
    Unreachable,
    WrongEngine,
)
from playbooks.engines.exits import ExitCause, Failure, last_log_line
from playbooks.engines.kit import exposition as exposition_reader
from playbooks.engines.launch_args import ArgSpec
from playbooks.engines.types import Bottleneck, DiagnoseSettings, Measurement
from playbooks.http import Reader, http_client, require_http_url


@dataclass(frozen=True)
class ConnectOptions:
    """What `Engine.connect` was asked beside the URL, handed to the engine's `open_client`."""

    api_key: str | None = None
    timeout_s: float = 10.0
    attempts: int = 3
    wait: Callable[..., float] | None = None
    clock: Callable[[], float] | None = None
    launch_args: LaunchArgs = None


ASKED_NOTHING = ConnectOptions()  # a client made from its URL alone


def engine_http(url: str, options: ConnectOptions, example: str) -> httpx.Client:
    """The HTTP client for an engine's server at `url` (an `EngineError` for one that is not an
    http(s) URL, showing `example`), with the options' key and timeout."""
    require_http_url(url, "server", example, EngineError)
    return http_client(url, bearer_token=options.api_key, timeout_s=options.timeout_s)


def exposition(text: str, wrong: Callable[[str], WrongEngine], path: str = "/metrics") -> list[Any]:
    """Every metric family in Prometheus exposition text; `wrong` (the engine's `WrongEngine`)
    where the answer at `path` is not such text."""
    try:
        return list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise wrong(f"{path} is not Prometheus text: {exc}") from None


def read_families(
    text: str,
    prefix: str,
    buckets: Collection[str],
    wrong: Callable[[str], WrongEngine],
    path: str = "/metrics",
) -> tuple[list[exposition_reader.Sample], set[str]]:
    """The samples and family names of families `prefix...`, bucket series other than
    `buckets` left out: the fast reader where the text has the common shape, else
    `prometheus_client` (which also says why a text is not exposition at all)."""
    fast = exposition_reader.read(text, prefix, buckets)
    if fast is not None:
        return fast.samples, fast.families
    families = [f for f in exposition(text, wrong, path) if f.name.startswith(prefix)]
    samples = [
        (s.name, s.labels, s.value)
        for f in families
        for s in f.samples
        if not s.name.endswith("_bucket") or s.name in buckets
    ]
    return samples, {f.name for f in families}


def read_metrics(
    text: str, spec: MetricsSpec, wrong: Callable[[str], WrongEngine], path: str = "/metrics"
) -> Metrics:
    """An engine's reading of its exposition: its families (`spec.prefix`), every sample with
    its label set, of the histograms' buckets only the latency ones read (`spec.histograms`,
    as the Prometheus source asks for)."""
    samples, names = read_families(text, spec.prefix, frozenset(spec.histograms), wrong, path)
    return Metrics.read(samples, names, ttft_histogram=spec.ttft_histogram)


class ClientBase:
    """Defaults for `base.EngineClient` over an engine's `metrics()`: a snapshot is the
    engine's reading of them, with or without metrics alike; no prompts are asked."""

    engine: Any
    base_url: str

    def metrics(self) -> Metrics:
        raise NotImplementedError

    def snapshot(self) -> Snapshot:
        return self.snapshot_of(self.metrics())

    def snapshot_of(self, metrics: Metrics) -> Snapshot:
        snapshot: Snapshot = self.engine.snapshot(metrics)
        return snapshot

    def load_snapshot(self) -> Snapshot:
        return self.snapshot()

    def describe_metrics(self) -> str:
        return f"{self.base_url}/metrics"

    def generate(self, prompt: Prompt, *, max_tokens: int, timeout_s: float) -> str:
        raise EngineError(f"kvpilot asks {self.engine.label} servers no prompts")


class EngineReader(Reader):
    """What the HTTP clients of SGLang and vLLM share: a server that does not answer is
    `Unreachable`, a /metrics it does not serve is `MetricsDisabled`, and prompts go through the
    OpenAI-compatible API (`completions`), naming the model where the engine needs that."""

    @property
    def engine(self) -> Engine:
        """The client's engine (each client names its own)."""
        raise NotImplementedError

    def _get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        try:
            return self._retried_get(path, params)
        except httpx.TransportError as exc:
            raise Unreachable(
                f"cannot reach {self.engine.label} at {self.base_url}: "
                f"{exc.__class__.__name__}: {exc}",
                "Is the server running, and is the URL (host and port) right?",
            ) from exc
        except httpx.DecodingError as exc:  # (a RequestError, not a TransportError)
            raise WrongEngine(
                f"{self.base_url}{path} answered a body that cannot be decoded: {exc}",
                "Does something between kvpilot and the server (a proxy) change its answers?",
            ) from exc

    def _exposition(self, path: str, hint: str) -> httpx.Response:
        """The answer at the engine's metrics `path`; MetricsDisabled, with `hint`, where the
        server does not serve it."""
        response = self._get(path)
        if response.status_code == 404:
            raise MetricsDisabled(f"{self.base_url}{path} is not served", hint)
        return response

    def served_model(self) -> str | None:
        """The model a completion request names; None: the server answers with the one it serves."""
        return None

    def generate(self, prompt: Prompt, *, max_tokens: int, timeout_s: float) -> str:
        """The greedy answer through the OpenAI-compatible API, naming `served_model()`."""
        return completions.generate(
            self.http,
            prompt,
            max_tokens=max_tokens,
            timeout_s=timeout_s,
            label=self.engine.label,
            model=self.served_model(),
        )


class EngineBase:
    """Defaults for `base.Engine`; a subclass sets `name`, `label`, `metrics` and implements
    `client` (or `connect`), `parse_settings`, `snapshot` and `rules_for`."""

    name: str
    label: str
    metrics: MetricsSpec
    chunk_arg: str | None = None
    readiness_paths: tuple[str, ...] = ("/health",)
    key_settings: tuple[str, ...] = ()
    not_compared: frozenset[str] = frozenset()

    def chunk_of(self, info: ServerSettings) -> int | None:
        return None

    def client(self, url: str, api_key: str | None, timeout_s: float) -> EngineClient:
        raise NotImplementedError

    def connect(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        attempts: int = 3,
        wait: Callable[..., float] | None = None,
        clock: Callable[[], float] | None = None,
        launch_args: LaunchArgs = None,
    ) -> EngineClient:
        """The engine's `open_client`, with these options."""
        options = ConnectOptions(api_key, timeout_s, attempts, wait, clock, launch_args)
        return self.open_client(url, options)

    def open_client(self, url: str, options: ConnectOptions) -> EngineClient:
        """`client(url, api_key, timeout_s)`: an engine that reports its settings and rates
        itself needs neither the caller's clock nor the launch arguments."""
        return self.client(url, options.api_key, options.timeout_s)

    def stored_settings(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return dict(raw)

    def parse_metrics(self, text: str) -> Metrics:
        """The families under the engine's prefix, from Prometheus exposition text."""
        return read_metrics(text, self.metrics, WrongEngine)

    def restore_snapshot(self, stored: Mapping[str, Any], t: float = 0.0) -> Snapshot:
        return Snapshot.from_json(stored, t)

    # launch arguments: none, for a read-only engine
    def _read_only(self) -> ArgError:
        return ArgError(f"kvpilot reads {self.label} servers only: it changes no launch arguments")

    def allowed_args(self) -> Mapping[str, str]:
        return {}

    def parse_change(self, items: Sequence[str]) -> dict[str, Any]:
        if items:
            raise self._read_only()
        return {}

    def with_change(self, args: Sequence[str], change: Mapping[str, Any]) -> list[str]:
        if change:
            raise self._read_only()
        return list(args)

    def arg_value(self, args: Sequence[str], name: str) -> str | None:
        return None

    def read_arg(self, args: Sequence[str], name: str) -> ArgReading:
        raise self._read_only()

    def spell(self, settings: Mapping[str, Any]) -> list[str]:
        raise self._read_only()

    def vocabulary(self) -> frozenset[str]:
        return frozenset()

    # signatures
    def exit_cause(self, code: int | None, log_tail: str) -> ExitCause:
        line = last_log_line(log_tail)
        status = "with no status" if code is None else f"with status {code}"
        said = f"{self.label} exited {status}" + (f": {line}" if line else "")
        return ExitCause(Failure.crashed, said)

    def classify_exit(self, code: int | None, log_tail: str) -> str:
        return self.exit_cause(code, log_tail).reason

    def bottleneck_of(
        self, info: ServerSettings, m: Measurement
    ) -> tuple[Bottleneck, list[str]] | str:
        return f"kvpilot has no {self.label} rules for stored measurements"


Settings = TypeVar("Settings", bound=ServerSettings)
ServerRules = TypeVar("ServerRules", bound=Rules)
Own_contra = TypeVar("Own_contra", contravariant=True)
Rules_co = TypeVar("Rules_co", bound=Rules, covariant=True)


class ArgumentRules(Protocol):
    """An engine's allow-list module (`allow_list.py`): the entries, and their reading and
    editing of argument lists in the engine's own spellings."""

    @property
    def ALLOWED(self) -> Mapping[str, ArgSpec]: ...

    def parse_change(self, items: Sequence[str]) -> dict[str, Any]: ...

    def with_change(self, args: Sequence[str], change: Mapping[str, Any]) -> list[str]: ...

    def arg_value(self, args: Sequence[str], name: str) -> str | None: ...

    def read_arg(self, args: Sequence[str], name: str) -> ArgReading: ...


class ClientModule(Protocol):
    """An engine's client module (`client.py`): what of a server's answer is stored, and the
    engine's families out of exposition text."""

    def stored_settings(self, raw: Mapping[str, Any], /) -> dict[str, Any]: ...

    def parse_metrics(self, text: str, /) -> Metrics: ...


class SignatureModule(Protocol):
    """An engine's signatures module (`signatures.py`): what its exits and log lines mean."""

    def exit_cause(self, code: int | None, log_tail: str, /) -> ExitCause: ...


class EngineRules(Protocol[Own_contra, Rules_co]):
    """An engine's rules module (`rules.py`), over its own settings type."""

    def rules_for(
        self, info: Own_contra, probes: DiagnoseSettings, *, measured: bool = ...
    ) -> Rules_co: ...

    def bottleneck_of(
        self, info: Own_contra, m: Measurement
    ) -> tuple[Bottleneck, list[str]] | str: ...


class TunedEngine(EngineBase, Generic[Settings, ServerRules]):
    """Defaults for an engine kvpilot tunes, over its own modules: the launch-argument members
    read its allow-list (`arguments`), the rules members its rules (`engine_rules`) after checking
    that the settings are of its own type (`settings_type`, called `settings_name` in the error),
    stored settings and metrics its client module (`api`), exits its `signatures`. `own_words` is
    its vocabulary besides the allow-list's flags (metric names, endpoints)."""

    arguments: ArgumentRules
    engine_rules: EngineRules[Settings, ServerRules]
    api: ClientModule
    signatures: SignatureModule
    settings_type: type[Settings]
    settings_name: str
    own_words: frozenset[str]

    def own(self, info: ServerSettings) -> Settings:
        if not isinstance(info, self.settings_type):
            name = type(info).__name__
            raise TypeError(
                f"{self.label}'s rules need {self.label}'s {self.settings_name}, got {name}"
            )
        return info

    def stored_settings(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return self.api.stored_settings(raw)

    def parse_metrics(self, text: str) -> Metrics:
        return self.api.parse_metrics(text)

    def exit_cause(self, code: int | None, log_tail: str) -> ExitCause:
        return self.signatures.exit_cause(code, log_tail)

    # launch arguments
    def allowed_args(self) -> Mapping[str, str]:
        return {name: spec.meaning for name, spec in self.arguments.ALLOWED.items()}

    def parse_change(self, items: Sequence[str]) -> dict[str, Any]:
        return self.arguments.parse_change(list(items))

    def with_change(self, args: Sequence[str], change: Mapping[str, Any]) -> list[str]:
        return self.arguments.with_change(args, change)

    def arg_value(self, args: Sequence[str], name: str) -> str | None:
        return self.arguments.arg_value(args, name)

    def read_arg(self, args: Sequence[str], name: str) -> ArgReading:
        return self.arguments.read_arg(args, name)

    def spell(self, settings: Mapping[str, Any]) -> list[str]:
        """The allowed settings alone (an engine whose metrics need a flag adds it)."""
        return self.arguments.with_change([], settings)

    def vocabulary(self) -> frozenset[str]:
        flags = {flag for spec in self.arguments.ALLOWED.values() for flag in spec.spellings}
        return frozenset({*self.own_words, *flags})

    # rules
    def rules_for(
        self, info: ServerSettings, probes: DiagnoseSettings, *, measured: bool = True
    ) -> ServerRules:
        return self.engine_rules.rules_for(self.own(info), probes, measured=measured)

    def bottleneck_of(
        self, info: ServerSettings, m: Measurement
    ) -> tuple[Bottleneck, list[str]] | str:
        return self.engine_rules.bottleneck_of(self.own(info), m)
