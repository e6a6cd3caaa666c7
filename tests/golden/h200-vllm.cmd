docker run --rm --name minimax-m3 \
  --gpus all \
  --shm-size 32g \
  --ipc=host \
  --security-opt no-new-privileges \
  --cap-drop ALL \
  --pids-limit 16384 \
  -p 127.0.0.1:30000:8000 \
  -e HF_HUB_OFFLINE=1 \
  -v /data/models/MiniMaxAI/MiniMax-M3/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb:/models/MiniMax-M3:ro \
  -v /var/cache/minimax-m3/jit/eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee:/var/cache/minimax-m3-jit \
  -e FLASHINFER_WORKSPACE_BASE=/var/cache/minimax-m3-jit \
  -e TORCHINDUCTOR_CACHE_DIR=/var/cache/minimax-m3-jit/inductor \
  -e TRITON_CACHE_DIR=/var/cache/minimax-m3-jit/triton \
  -e VLLM_CACHE_ROOT=/var/cache/minimax-m3-jit/vllm \
  -e XDG_CACHE_HOME=/var/cache/minimax-m3-jit \
  vllm/vllm-openai@sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee \
  /models/MiniMax-M3 \
  --served-model-name MiniMaxAI/MiniMax-M3 \
  --tensor-parallel-size 8 \
  --block-size 128 \
  --max-model-len 65536 \
  --tool-call-parser minimax_m3 \
  --enable-auto-tool-choice \
  --reasoning-parser minimax_m3 \
  --override-generation-config '{"max_new_tokens":32768}' \
  --host 0.0.0.0 \
  --port 8000
