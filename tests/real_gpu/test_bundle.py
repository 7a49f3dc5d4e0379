"""The GPU bundle's pure parts: the lock, what is stripped, the stand-ins, the archive and its
size check. No network and no GPU (the one test that asks PyPI is marked `network`)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.real_gpu import archive, image, stage
from tests.real_gpu.bundle import LOCK, PLATFORMS, REPO, pip_download, wheel_hashes
from tests.real_gpu.lock import (
    LockError,
    Pin,
    declared_requirements,
    match_wheels,
    parse_lock,
    render_lock,
    unmet,
    wheel_key,
)

H1, H2 = "a" * 64, "b" * 64


# ----------------------------------------------------------------------------------- the lock


def test_lock_pins_sglang_0_5_17_and_its_versions_with_one_hash_each() -> None:
    pins = {p.name: p for p in parse_lock(LOCK.read_text())}
    assert all(len(p.hashes) == 1 for p in pins.values())
    expected = {
        "sglang": "0.5.17",
        "sglang-kernel": "0.4.5",
        "transformers": "5.12.1",
        "tokenizers": "0.22.2",
        "xgrammar": "0.2.1",
        "apache-tvm-ffi": "0.1.11",
        "openai": "2.6.1",
        "compressed-tensors": "0.18.0",
    }
    assert {k: pins[k].version for k in expected} == expected
    assert "kubernetes" not in pins and "torch" not in pins and "flashinfer-python" not in pins


def test_kvpilot_dependencies_are_in_the_image_or_the_lock_but_kubernetes() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {Requirement(d).name.lower() for d in project["dependencies"]}
    pinned = {p.name for p in parse_lock(LOCK.read_text())}
    missing = sorted(n for n in names - image.PACKAGES - pinned if n != "kubernetes")
    assert missing == []


def test_nothing_is_both_carried_and_listed_as_unneeded_or_stood_in() -> None:
    pinned = {p.name for p in parse_lock(LOCK.read_text())}
    assert pinned.isdisjoint(image.NOT_NEEDED)
    assert pinned.isdisjoint(n.lower() for n in image.STAND_INS)


def test_parse_and_render_round_trip() -> None:
    pins = [Pin("sglang", "0.5.17", (H1,)), Pin("fastapi", "0.165.0", (H1, H2)), Pin("x", "1", ())]
    text = render_lock("a header\nof two lines", pins)
    assert text.startswith("# a header\n# of two lines\n")
    assert parse_lock(text) == sorted(pins, key=lambda p: p.name)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sglang>=0.5\n", "is not `name==version"),
        ("sglang==0.5.17\nSGLang==0.5.18\n", "pinned twice"),
        ("-e .\n", "is not `name==version"),
    ],
)
def test_a_bad_lock_line_is_named(text: str, message: str) -> None:
    with pytest.raises(LockError, match=message):
        parse_lock(text)


def test_wheel_names_give_the_canonical_name_and_version() -> None:
    assert wheel_key("sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl") == (
        "sglang-kernel",
        "0.4.5",
    )
    assert wheel_key("Jinja2-3.1.6-py3-none-any.whl") == ("jinja2", "3.1.6")
    with pytest.raises(LockError):
        wheel_key("sglang-0.5.17.tar.gz")


def test_wheels_must_match_the_lock_one_for_one() -> None:
    pins = [Pin("sglang", "0.5.17", (H1,)), Pin("dill", "0.4.1", (H2,))]
    good = {
        "sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl": H1,
        "dill-0.4.1-py3-none-any.whl": H2,
    }
    assert match_wheels(pins, good) == {
        "sglang": "sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl",
        "dill": "dill-0.4.1-py3-none-any.whl",
    }
    changed = {**good, "dill-0.4.1-py3-none-any.whl": H1}
    with pytest.raises(LockError, match=r"sha256 a+ is not in the lock"):
        match_wheels(pins, changed)
    extra = {**good, "orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.whl": H1}
    with pytest.raises(LockError, match=r"orjson.*not in the lock"):
        match_wheels(pins, extra)
    with pytest.raises(LockError, match=r"dill==0\.4\.1: 0 wheels found"):
        match_wheels(pins, {"sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl": H1})


def test_declared_requirements_are_those_that_apply_on_the_gpu_image() -> None:
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Requires-Dist: torch==2.11.0",
            'Requires-Dist: av==16.1.0; platform_machine == "aarch64"',
            "Requires-Dist: backports.zoneinfo; python_version < '3.9'",
            'Requires-Dist: triton; platform_system == "Linux" and platform_machine == "x86_64"',
            'Requires-Dist: pytest; extra == "test"',
        ]
    )
    assert [r.name for r in declared_requirements(metadata)] == ["torch", "triton"]


def test_unmet_names_what_is_missing_and_what_is_too_old() -> None:
    declared = {
        "sglang": [Requirement("torch==2.11.0"), Requirement("flashinfer_python==0.6")],
        "fastapi": [Requirement("starlette>=1.6.0"), Requirement("pydantic>=2.9")],
        "openai": [Requirement("sniffio"), Requirement("jiter<1,>=0.10.0")],
    }
    carried = {"starlette": "1.10.0", "pydantic": "2.8.0", "jiter": "0.19.0"}
    problems = unmet(declared, carried, {"torch"}, {"flashinfer-python": "a stand-in"})
    assert problems == [
        "fastapi needs pydantic>=2.9, but the bundle carries pydantic 2.8.0",
        "openai needs sniffio, which is neither carried, nor in the GPU image, nor listed as "
        "not needed",
    ]


# ---------------------------------------------------------------------------- what is stripped


@pytest.mark.parametrize(
    ("path", "stripped"),
    [
        ("sgl_kernel/flash_ops.abi3.so", True),
        ("sgl_kernel/flashmla_ops.abi3.so", True),
        ("sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so", True),
        ("sgl_kernel/sm100/common_ops.abi3.so", True),
        ("sgl_kernel/sm90/common_ops.abi3.so", False),
        ("sgl_kernel/elementwise.py", False),
        ("sgl_kernel/spatial_ops.abi3.so", False),
        ("xgrammar/lib/libxgrammar.a", True),
        ("xgrammar/libxgrammar_bindings.so", False),
        ("sglang/srt/server/_core.cpython-312-x86_64-linux-gnu.so", True),
        ("sglang/srt/grpc/_core.cpython-312-x86_64-linux-gnu.so", True),
        ("sglang/srt/multimodal/_core.cpython-312-x86_64-linux-gnu.so", True),
        ("sglang/srt/server_args.py", False),
        ("sglang/kernels/jit/csrc/attention/kda_prefill.cu", False),
        ("transformers/models/llama/__pycache__/modeling_llama.cpython-312.pyc", True),
        ("sglang-0.5.17.dist-info/METADATA", False),
        ("sglang-0.5.17.dist-info/RECORD", False),
    ],
)
def test_strip_rules(path: str, stripped: bool) -> None:
    assert (stage.strip_reason(path) is not None) == stripped


def test_unpacking_a_wheel_leaves_out_what_is_stripped(tmp_path: Path) -> None:
    wheel = tmp_path / "sgl_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sgl_kernel/__init__.py", "x = 1\n")
        zf.writestr("sgl_kernel/flash_ops.abi3.so", b"\0" * 1000)
        info = zipfile.ZipInfo("sgl_kernel/sm90/common_ops.abi3.so")
        info.external_attr = 0o755 << 16
        zf.writestr(info, b"\0" * 10)
    site = tmp_path / "site"
    tally = stage.Unpacked()
    stage.unpack_wheel(wheel, site, tally)
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()) == [
        "sgl_kernel/__init__.py",
        "sgl_kernel/sm90/common_ops.abi3.so",
    ]
    assert (tally.kept, tally.stripped, tally.stripped_bytes) == (2, 1, 1000)
    assert os.access(site / "sgl_kernel/sm90/common_ops.abi3.so", os.X_OK)


def test_platform_tags_stay_within_the_images_glibc() -> None:
    assert "manylinux_2_34_x86_64" in PLATFORMS and "manylinux2014_x86_64" in PLATFORMS
    assert "manylinux_2_40_x86_64" not in PLATFORMS


# -------------------------------------------------------------------------------- stand-ins

STAND_IN_CHECK = r"""
import importlib, sys

def refused(module):
    try:
        importlib.import_module(module)
    except ImportError:
        return True
    return False

import flashinfer
from flashinfer import bmm_fp8
from flashinfer.sampling import min_p_sampling_from_probs, top_k_top_p_sampling_from_probs
from flashinfer.prefill import cudnn_batch_prefill_with_kv_cache
assert flashinfer.__file__.startswith(sys.argv[1]), flashinfer.__file__
# what sgl_kernel probes, and what a permissive stand-in would wrongly answer
for absent in ("flashinfer.norm", "flashinfer.fused_moe", "flashinfer.gemm", "flashinfer.rope"):
    assert refused(absent), absent
for name in ("norm", "top_k_renorm_probs", "BatchPrefillWithPagedKVCacheWrapper", "__version__"):
    assert not hasattr(flashinfer, name), name
try:
    from flashinfer import fast_decode_plan
except ImportError:
    pass
else:
    raise AssertionError("fast_decode_plan imported")
try:
    top_k_top_p_sampling_from_probs(None, None, None)
except RuntimeError as exc:
    assert "stand-in for flashinfer" in str(exc) and "--attention-backend triton" in str(exc)
else:
    raise AssertionError("a stand-in function returned")
import soundfile, zstandard
from IPython.display import HTML, display
assert issubclass(soundfile.LibsndfileError, RuntimeError)
try:
    zstandard.ZstdDecompressor()
except zstandard.ZstdError:
    pass
display(HTML("<b>shown</b>"))
print("stand-ins ok")
"""


def test_stand_ins_define_only_the_imported_names(tmp_path: Path) -> None:
    written = stage.write_stand_ins(tmp_path, image.STAND_INS)
    assert sorted(written) == [
        "IPython/__init__.py",
        "IPython/display.py",
        "flashinfer/__init__.py",
        "flashinfer/prefill.py",
        "flashinfer/sampling.py",
        "soundfile.py",
        "zstandard.py",
    ]
    result = subprocess.run(
        [sys.executable, "-c", STAND_IN_CHECK, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["<b>shown</b>", "stand-ins ok"]


def test_a_stand_in_never_hides_a_carried_package(tmp_path: Path) -> None:
    (tmp_path / "zstandard").mkdir()
    (tmp_path / "zstandard" / "__init__.py").write_text("")
    with pytest.raises(FileExistsError, match="carries zstandard itself"):
        stage.write_stand_ins(tmp_path, ["zstandard"])


# ---------------------------------------------------------------------------------- archive


def _tree(root: Path) -> None:
    (root / "site" / "pkg").mkdir(parents=True)
    (root / "site" / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    lib = root / "site" / "pkg" / "lib.so"
    lib.write_bytes(os.urandom(2048))
    lib.chmod(0o700)
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}\n")
    (root / "BUNDLE.json").write_text('{"format": 1}\n')


def test_the_archive_is_the_same_bytes_however_the_files_were_made(tmp_path: Path) -> None:
    _tree(tmp_path / "stage")
    first = tmp_path / "one.tar.xz"
    archive.write_archive(tmp_path / "stage", first, preset=1)
    for path in (tmp_path / "stage").rglob("*"):  # other times, owners' modes
        os.utime(path, (1_000_000, 1_000_000))
    (tmp_path / "stage" / "BUNDLE.json").chmod(0o600)
    second = tmp_path / "two.tar.xz"
    archive.write_archive(tmp_path / "stage", second, preset=1)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:
        names = tar.getnames()
        infos = {i.name: i for i in tar.getmembers()}
    assert names == [
        "BUNDLE.json",
        "model",
        "model/config.json",
        "site",
        "site/pkg",
        "site/pkg/__init__.py",
        "site/pkg/lib.so",
    ]
    assert infos["site/pkg/lib.so"].mode == 0o755 and infos["BUNDLE.json"].mode == 0o644
    assert {i.mtime for i in infos.values()} == {archive.FIXED_MTIME}
    out = tmp_path / "out"
    archive.extract(first, out)
    assert (out / "site/pkg/__init__.py").read_text() == "VALUE = 1\n"
    assert os.access(out / "site/pkg/lib.so", os.X_OK)


def test_extraction_refuses_members_that_leave_the_folder(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.xz"
    with tarfile.open(bad, "w:xz") as tar:
        data = b"x"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.TarError):
        archive.extract(bad, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()


def test_size_check_names_the_largest_parts() -> None:
    mib = archive.MIB
    assert archive.size_problem(40 * mib, 56 * mib, []) is None
    text = archive.size_problem(60 * mib, 56 * mib, [("xgrammar", 51 * mib), ("sglang", 47 * mib)])
    assert text is not None
    assert "60.0 MiB, over its budget of 56.0 MiB" in text
    assert "xgrammar" in text and "51.0 MiB" in text and "STRIP_RULES" in text
    assert stage.largest({"a": 1, "b": 3, "c": 3}, 2) == [("b", 3), ("c", 3)]


# ---------------------------------------------------------------------------------- network


@pytest.mark.network
def test_lock_pins_download_from_pypi_with_their_hashes(tmp_path: Path) -> None:
    small = [p for p in parse_lock(LOCK.read_text()) if p.name in ("sniffio", "distro", "tenacity")]
    requirements = tmp_path / "r.txt"
    requirements.write_text(render_lock("three small pins of the lock", small))
    pip_download(requirements, tmp_path / "wheels", hashes=True)
    assert match_wheels(small, wheel_hashes(tmp_path / "wheels")).keys() == {
        "sniffio",
        "distro",
        "tenacity",
    }
