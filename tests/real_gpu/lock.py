"""The GPU bundle's lock file: exact pins with hashes, and what the pinned wheels declare.

`requirements-gpu.txt` is pip's hash-checking format (`name==version \\` then `--hash=sha256:...`
lines), so `pip download --require-hashes` enforces it. Parsing it here lets the builder check the
downloaded files again and tell, before anything is packed, which declared dependency is neither
carried, nor in the GPU image, nor known to be unneeded on SGLang's text path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# The GPU image's interpreter and platform, for evaluating requirement markers.
TARGET_ENVIRONMENT = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


class LockError(ValueError):
    """The lock file, or a file checked against it, is not what it should be."""


@dataclass(frozen=True)
class Pin:
    name: str  # canonical (PEP 503) name
    version: str
    hashes: tuple[str, ...]  # sha256 hex digests pip accepts for this pin

    @property
    def line(self) -> str:
        return f"{self.name}=={self.version}"


def parse_lock(text: str) -> list[Pin]:
    """The pins of a hash-checking requirements file, in file order (continuation lines joined)."""
    joined = re.sub(r"\\\n", " ", text)
    pins: list[Pin] = []
    seen: set[str] = set()
    for number, raw in enumerate(joined.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.match(line)
        if match is None:
            raise LockError(f"line {number}: {raw.strip()!r} is not `name==version --hash=...`")
        name = canonicalize_name(match.group(1))
        if name in seen:
            raise LockError(f"line {number}: {name} is pinned twice")
        seen.add(name)
        hashes = tuple(_HASH.findall(line))
        pins.append(Pin(name, match.group(2), hashes))
    return pins


def render_lock(header: str, pins: Iterable[Pin]) -> str:
    """The lock file's text: the header's comment lines, then one hashed pin per package."""
    lines = [f"# {h}".rstrip() for h in header.splitlines()]
    for pin in sorted(pins, key=lambda p: p.name):
        lines.append(f"{pin.line} \\" if pin.hashes else pin.line)
        lines.extend(
            f"    --hash=sha256:{h}" + (" \\" if i + 1 < len(pin.hashes) else "")
            for i, h in enumerate(pin.hashes)
        )
    return "\n".join(lines) + "\n"


def wheel_key(filename: str) -> tuple[str, str]:
    """(canonical name, version) of a wheel file name such as `sglang_kernel-0.4.5-cp310-...`."""
    parts = filename.removesuffix(".whl").split("-")
    if len(parts) < 5 or not filename.endswith(".whl"):
        raise LockError(f"{filename} is not a wheel file name")
    return canonicalize_name(parts[0]), parts[1]


def match_wheels(pins: Iterable[Pin], files: Mapping[str, str]) -> dict[str, str]:
    """Each pin's wheel among `files` (file name -> sha256); raises naming every mismatch.

    Exactly one file per pin, of the pinned version, with a hash the lock allows: a wheel of
    another version, a second wheel of the same package, or a changed file is refused.
    """
    by_key: dict[tuple[str, str], list[str]] = {}
    for filename in files:
        by_key.setdefault(wheel_key(filename), []).append(filename)
    chosen: dict[str, str] = {}
    problems: list[str] = []
    for pin in pins:
        found = by_key.get((pin.name, pin.version), [])
        if len(found) != 1:
            problems.append(f"{pin.line}: {len(found)} wheels found, expected one")
            continue
        if files[found[0]] not in pin.hashes:
            problems.append(f"{found[0]}: sha256 {files[found[0]]} is not in the lock")
            continue
        chosen[pin.name] = found[0]
    pinned = {(p.name, p.version) for p in pins}
    problems.extend(f"{f}: not in the lock" for f in files if wheel_key(f) not in pinned)
    if problems:
        raise LockError("the wheels do not match the lock:\n  " + "\n  ".join(problems))
    return chosen


def declared_requirements(metadata: str) -> list[Requirement]:
    """The unconditional `Requires-Dist` entries of a wheel's METADATA that apply on the
    GPU image (markers evaluated there; extras left out)."""
    out: list[Requirement] = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement as exc:
            raise LockError(f"unreadable requirement {line!r}: {exc}") from None
        if req.marker is None or req.marker.evaluate(TARGET_ENVIRONMENT):
            out.append(req)
    return out


def unmet(
    declared: Mapping[str, list[Requirement]],
    carried: Mapping[str, str],
    image: Iterable[str],
    not_needed: Mapping[str, str],
) -> list[str]:
    """Every declared dependency the bundle leaves unmet, as a sentence.

    `declared`: each carried package's requirements; `carried`: canonical name -> version of
    what the bundle holds; `image`: what the GPU image has (any version); `not_needed`: names
    the text path does not import, with the reason. A carried dependency must also satisfy the
    declared version range.
    """
    have_image = {canonicalize_name(n) for n in image}
    skip = {canonicalize_name(n) for n in not_needed}
    problems: list[str] = []
    for package, reqs in sorted(declared.items()):
        for req in reqs:
            name = canonicalize_name(req.name)
            if name in carried:
                if req.specifier and not req.specifier.contains(carried[name], prereleases=True):
                    problems.append(
                        f"{package} needs {req}, but the bundle carries {name} {carried[name]}"
                    )
            elif name not in have_image and name not in skip:
                problems.append(
                    f"{package} needs {req}, which is neither carried, nor in the GPU image, "
                    "nor listed as not needed"
                )
    return problems
