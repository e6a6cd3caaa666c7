docker run --rm --name minimax-m3 \
  --gpus all \
  --shm-size 32g \
  --ipc=host \
  --security-opt no-new-privileges \
  --cap-drop ALL \
  --pids-limit 16384 \
  -p 127.0.0.1:30000:30000 \
  -e HF_HUB_OFFLINE=1 \
  -v /data/models/MiniMax-M3-MXFP8:/models/MiniMax-M3-MXFP8:ro \
  lmsysorg/sglang:dev-cu13-minimax-m3 \
  sglang serve \
  --trust-remote-code \
  --model-path /models/MiniMax-M3-MXFP8 \
  --reasoning-parser auto \
  --tool-call-parser auto \
  --tp 4 \
  --attention-backend fa4 \
  --mm-attention-backend flashinfer_cudnn \
  --moe-runner-backend deep_gemm \
  --chunked-prefill-size 8192 \
  --mem-fraction-static 0.75 \
  --host 0.0.0.0 \
  --port 30000
