"""What the GPU machine's image already has, and what the bundle deliberately leaves out.

The image ('cuda') runs Python 3.12.3 as `python3` (/opt/torch/.venv/bin/python3) with torch
2.11.0+cu130 and triton 3.6.0, and has no network: anything else travels in the bundle. Its
package list below was read on such a machine with `pip list` (2026-11; safetensors from a
second reading); versions are known only for the few named in VERSIONS. The bundle's own copies
come first on the path, so where both have a package (transformers, tokenizers) the bundle's
wins.
"""

from __future__ import annotations

PYTHON = (3, 12)  # the bundle holds cp312 wheels
VERSIONS = {
    "torch": "2.11.0",  # sglang 0.5.14-0.5.18 pin torch==2.11.0
    "triton": "3.6.0",
    "transformers": "5.17.0",  # too new for sglang 0.5.17: the bundle carries 5.12.1
    "tokenizers": "0.23.2",  # transformers 5.12.1 needs <= 0.23.0: the bundle carries 0.22.2
    "numpy": "2.5.2",
    "huggingface-hub": "1.33.0",
    "safetensors": "0.8.0",
}

_PIP_LIST = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
"""
PACKAGES = frozenset(_PIP_LIST.split())

# What sglang 0.5.17 declares but the bundle does not carry, and why. The server was run on an
# H100 without each of these (`--attention-backend triton --sampling-backend pytorch`, a Llama
# model, text only); the ones imported at all on that path get a stand-in (STAND_INS).
_UNUSED = "not imported when serving a Llama model on text with the triton attention backend"
NOT_NEEDED = {
    "anthropic": _UNUSED,
    "blobfile": _UNUSED,
    "cuda-python": "the image's cuda-bindings and cuda-core are what it would install",
    "datasets": _UNUSED,
    "easydict": "used by multimodal generation (sglang.multimodal_gen) only",
    "flash-attn-4": "FlashAttention-4 is a Blackwell attention backend; triton is used",
    "flashinfer-python": "SGLANG_IS_FLASHINFER_AVAILABLE=false, and a stand-in answers the three "
    "names sglang imports anyway",
    "helion": _UNUSED,
    "humming-kernels": _UNUSED,
    "ipython": "only IPython.display is imported (sglang.utils, for notebooks): a stand-in",
    "kernels": _UNUSED,
    "llguidance": "a grammar backend; xgrammar is carried",
    "mistral-common": "tokenizers of Mistral models only",
    "modelscope": "downloads models from ModelScope; the model is local",
    "nvidia-cutlass-dsl": "CuTe DSL kernels for Blackwell and MLA",
    "nvidia-mathdx": _UNUSED,
    "openai-harmony": "the gpt-oss chat format",
    "outlines": "a grammar backend; xgrammar is carried",
    "py-spy": "a profiler, started only on request",
    "quack-kernels": "CuTe DSL helpers of the FlashAttention-4 kernels",
    "sgl-deep-gemm": "FP8 GEMMs; the model runs in bf16",
    "smg-grpc-servicer": "the gRPC front end, not started",
    "soundfile": "imported by the audio endpoints' modules only: a stand-in",
    "tilelang": _UNUSED,
    "tokenspeed-mla": "an MLA attention backend",
    "torch-memory-saver": "memory release for RL weight updates, off by default",
    "torchao": "quantization of weights at load, off by default",
    "torchcodec": "video and audio decoding for multimodal models",
    "zstandard": "imported for compressed request bodies only: a stand-in",
}

# Modules the text path imports without using, provided by tests/real_gpu/standins/.
STAND_INS = ("flashinfer", "soundfile", "zstandard", "IPython")
