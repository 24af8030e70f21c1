#!/usr/bin/env bash
# Installs what tidal's build, tests and demo need, only where missing, so that on a fresh
# Debian machine `make check` and `make demo` do all the set-up themselves.
#   Debian packages: compilers' libraries (HDF5, GSL, libpng, OpenBLAS, jansson, PCRE2, cmocka,
#                    FreeType, zlib for .json.gz datasets), the DejaVu font tidal-heatmap writes
#                    with, and the Python the test helpers run on (numpy, h5py, torch); clang
#                    with its sanitizer/libFuzzer runtime and libomp for `make fuzz`.
#   PyPI (test-only, into .venv which sees the Debian Python packages): ml_dtypes, safetensors,
#                    tokenizers, jinja2 (chat templates rendered as transformers renders them);
#                    optional: transformers, peft (+ accelerate) for the cross-checks against them,
#                    tensorboard (its own reader checks the event files of --report-to),
#                    math-verify (the reference for datasets/rewards/math_boxed.py).
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(build-essential pkg-config libhdf5-dev hdf5-tools libgsl-dev libopenblas-dev libjansson-dev
      libpcre2-dev libcmocka-dev libpng-dev libfreetype-dev zlib1g-dev fonts-dejavu-core
      clang libclang-rt-dev libomp-dev
      python3 python3-venv python3-numpy python3-h5py python3-torch python3-scipy)
# module:pip-spec. numpy<2 keeps pip from shadowing Debian's numpy 1.x, which h5py and torch
# from Debian are built against; ml_dtypes 0.4 is the last series that runs on numpy 1.x.
PYPI=("ml_dtypes:ml_dtypes<0.5" "safetensors:safetensors" "tokenizers:tokenizers" "jinja2:jinja2")
# optional, installed on its own so a failure costs only the checks that use it (they skip):
# transformers 4.46 is the last series that runs on Debian's torch 1.13 (test_sft.py and
# test_model_transformers.py load tidal's checkpoints in it)
PYPI_OPTIONAL=("transformers:transformers==4.46.*")

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing Debian packages: ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Test helpers run on Debian's python3 (where numpy, h5py and torch come from) inside a venv.
if [ ! -x .venv/bin/python ]; then
  echo "deps: creating .venv (Debian python3 + system site packages)" >&2
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
need=()
for m in "${PYPI[@]}"; do .venv/bin/python -c "import ${m%%:*}" 2>/dev/null || need+=("${m#*:}"); done
if ((${#need[@]})); then
  echo "deps: installing PyPI test helpers: ${need[*]}" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check "numpy<2" "${need[@]}" \
    || echo "deps: warning: could not install ${need[*]}; tests that need them will be skipped" >&2
fi
for m in "${PYPI_OPTIONAL[@]}"; do
  .venv/bin/python -c "import ${m%%:*}" 2>/dev/null && continue
  echo "deps: installing optional PyPI test helper: ${m#*:}" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check "numpy<2" "${m#*:}" \
    || echo "deps: note: could not install ${m#*:}; the checks that need it will be skipped" >&2
done
# peft (tests/py/test_lora_peft.py runs PEFT's own merge_adapter/unmerge_adapter): accelerate < 1.1
# first (its torch >= 1.10 accepts Debian's torch 1.13.0a0), then peft 0.17 without dependencies:
# its torch >= 1.13.0 does not accept the pre-release version 1.13.0a0, and pip would fetch a
# multi-GB torch 2.x with its CUDA wheels into .venv beside Debian's. peft 0.17 runs on torch 1.13
# and transformers 4.46 (checked) and has PEFT's current unmerge arithmetic (>= 0.16).
if ! .venv/bin/python -c "import peft" 2>/dev/null; then
  echo "deps: installing optional PyPI test helpers: accelerate<1.1, peft==0.17.* (no deps)" >&2
  { .venv/bin/python -c "import accelerate" 2>/dev/null ||
      .venv/bin/python -m pip install -q --disable-pip-version-check "numpy<2" "accelerate<1.1"; } &&
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "peft==0.17.*" \
    || echo "deps: note: could not install peft; test_lora_peft.py will be skipped" >&2
fi
# tensorboard (tests/py/test_report_to.py reads tidal's --report-to event files with TensorBoard's
# own reader and CRC): its requirements (absl-py, grpcio, markdown, numpy, packaging, pillow,
# protobuf, setuptools, tensorboard-data-server, werkzeug) have no torch, and a dry run makes sure
# of it: a plan that would bring torch (or its nvidia-* wheels) into .venv installs nothing.
if ! .venv/bin/python -c "import tensorboard" 2>/dev/null; then
  TB=("numpy<2" "tensorboard>=2.12,<3")
  plan=$(.venv/bin/python -m pip install -q --disable-pip-version-check --dry-run --report - "${TB[@]}" 2>/dev/null |
         .venv/bin/python -c 'import json, sys; print(" ".join(i["metadata"]["name"].lower() for i in json.load(sys.stdin)["install"]))' \
         2>/dev/null) || plan=""
  case " $plan " in
    *" tensorboard "*)
      if [[ " $plan " == *" torch "* || " $plan " == *" nvidia-"* ]]; then
        echo "deps: note: tensorboard would bring torch into .venv ($plan): not installed; test_report_to.py will be skipped" >&2
      else
        echo "deps: installing optional PyPI test helper: tensorboard ($plan)" >&2
        .venv/bin/python -m pip install -q --disable-pip-version-check "${TB[@]}" \
          || echo "deps: note: could not install tensorboard; test_report_to.py will be skipped" >&2
      fi ;;
    *) echo "deps: note: could not resolve tensorboard (offline?); test_report_to.py will be skipped" >&2 ;;
  esac
fi
# math-verify (tests/py/test_reward_math.py checks datasets/rewards/math_boxed.py's default
# grader against HF's verifier): pure Python (latex2sympy2_extended, sympy, antlr4 runtime).
if ! .venv/bin/python -c "import math_verify" 2>/dev/null; then
  echo "deps: installing optional PyPI test helper: math-verify" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check "math-verify>=0.7,<1" \
    || echo "deps: note: could not install math-verify; test_reward_math.py checks without it" >&2
fi
exit 0
