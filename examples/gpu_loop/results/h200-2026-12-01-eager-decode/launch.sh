#!/bin/sh
# the decode server (perfscope's reproduction server), started eagerly
cd /work/main/.devcarry-h14/repo
export PYTHONUNBUFFERED=1
exec /opt/torch/.venv/bin/python3 -m examples.repro_server --device cuda --no-flashinfer --kv-strategy fp8 \
  --port 34595 --max-running-requests 8 --cuda-graph-max-bs 8 \
  --num-layers 32 --hidden-size 1024 --num-heads 8 --vocab-size 32000 --max-total-tokens 65536 >> /tmp/perfscope-eager-440/server.log 2>&1
