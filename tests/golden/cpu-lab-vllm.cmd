docker run --rm --name minimax-m3 \
  --shm-size 32g \
  --ipc=host \
  --security-opt no-new-privileges \
  --cap-drop ALL \
  --pids-limit 1024 \
  --read-only \
  --tmpfs /tmp:rw,nosuid,nodev,size=1g,mode=1777 \
  --user 65534:65534 \
  -p 127.0.0.1:30000:8000 \
  -e HF_HUB_OFFLINE=1 \
  -e HOME=/tmp \
  -e VLLM_CPU_KVCACHE_SPACE=1 \
  -v /data/models/mm3-lab/tiny-m3/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb:/models/tiny-m3:ro \
  -v /var/cache/minimax-m3/jit/eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee:/var/cache/minimax-m3-jit \
  -e FLASHINFER_WORKSPACE_BASE=/var/cache/minimax-m3-jit \
  -e TORCHINDUCTOR_CACHE_DIR=/var/cache/minimax-m3-jit/inductor \
  -e TRITON_CACHE_DIR=/var/cache/minimax-m3-jit/triton \
  -e VLLM_CACHE_ROOT=/var/cache/minimax-m3-jit/vllm \
  -e XDG_CACHE_HOME=/var/cache/minimax-m3-jit \
  mm3-lab/vllm-cpu@sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee \
  /models/tiny-m3 \
  --served-model-name mm3-lab/tiny-m3 \
  --max-model-len 4096 \
  --enforce-eager \
  --reasoning-parser qwen3 \
  --enable-auto-tool-choice \
  --tool-call-parser hermes \
  --host 0.0.0.0 \
  --port 8000
