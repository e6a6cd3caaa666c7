#!/usr/bin/env bash
# Record an engine's argument list whole from an engine image, as the serving role reads it
# (roles/serving/files/engine_args/<engine>-<version>.json; serving_engines.<engine>.argparse
# names the file). The engine's own Python builds its own parser (tools/engine_args/dump_parser.py,
# fed on stdin: nothing is mounted, no network); this script adds where it came from.
#
#   tools/engine_args/record_image.sh vllm vllm/vllm-openai@sha256:... [python3] > vllm-X.json
#   tools/engine_args/record_image.sh vllm mm3-lab/vllm-cpu:lab /opt/vllm/bin/python
#   tools/engine_args/record_image.sh sglang lmsysorg/sglang@sha256:... python3
#
# Run it on the staging host against the pinned image a site serves, then set
# serving_engines.<engine>.argparse to the new file (roles/serving/vars/main.yml).
set -euo pipefail
engine=${1:?usage: record_image.sh vllm|sglang IMAGE [PYTHON]}
image=${2:?usage: record_image.sh vllm|sglang IMAGE [PYTHON]}
python=${3:-python3}
here=$(cd "$(dirname "$0")" && pwd)
image_id=$(docker image inspect --format '{{.Id}}' "$image")
digests=$(docker image inspect --format '{{json .RepoDigests}}' "$image")
dump=$(mktemp)
trap 'rm -f "$dump"' EXIT
docker run --rm -i --network none --entrypoint "$python" "$image" - "$engine" < "$here/dump_parser.py" > "$dump"
IMAGE="$image" IMAGE_ID="$image_id" DIGESTS="$digests" ENGINE="$engine" DUMP="$dump" python3 - <<'PY'
import datetime, json, os
with open(os.environ["DUMP"]) as handle:
    dump = json.load(handle)
record = {
    "source": {
        "engine": os.environ["ENGINE"],
        "version": dump.pop("version"),
        "python": dump.pop("python"),
        "recorded_from": "the engine's own parser, built inside the image",
        "image": os.environ["IMAGE"],
        "image_id": os.environ["IMAGE_ID"],
        "repo_digests": json.loads(os.environ["DIGESTS"]),
        "recorded_with": "tools/engine_args/record_image.sh (tools/engine_args/dump_parser.py)",
        "recorded_at": datetime.date.today().isoformat(),
    },
}
record.update(dump)
print(json.dumps(record, indent=1))
PY
