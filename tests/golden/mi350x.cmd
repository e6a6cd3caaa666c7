docker run --rm --name minimax-m3 \
  --device /dev/kfd \
  --device /dev/dri \
  --group-add video \
  --shm-size 32g \
  --ipc=host \
  --security-opt no-new-privileges \
  --cap-drop ALL \
  --pids-limit 16384 \
  -p 127.0.0.1:30000:30000 \
  -e HF_HUB_OFFLINE=1 \
  -e SGLANG_USE_AITER=1 \
  -v /data/models/MiniMaxAI/MiniMax-M3-MXFP8/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb:/models/MiniMax-M3-MXFP8:ro \
  lmsysorg/sglang@sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee \
  sglang serve \
  --trust-remote-code \
  --model-path /models/MiniMax-M3-MXFP8 \
  --reasoning-parser auto \
  --tool-call-parser auto \
  --tp 8 \
  --quantization mxfp8 \
  --dtype bfloat16 \
  --chunked-prefill-size 8192 \
  --mem-fraction-static 0.80 \
  --enable-metrics \
  --host 0.0.0.0 \
  --port 30000
