#!/usr/bin/env python3
"""Create a small model repository for the lab hub mirror (olah) at a reproducible commit.

A STAND-IN for MiniMaxAI/MiniMax-M3*: same kinds of files (safetensors shards in git-lfs,
remote-code *.py, config, tokenizer, LICENSE), a few MB instead of 444 GB. Bytes come from a
seeded generator and the commit has fixed author/dates, so the commit sha is the same on every
run and can be pinned in the inventory like a real revision.

usage: make_repo.py DIR SHARD_BYTES[,SHARD_BYTES...] [--tamper-shard N | --next-revision]
  --tamper-shard N  after committing, overwrite shard N's LFS object with other bytes of the
                    same size: the mirror then serves different bytes under the hub's sha256.
  --next-revision   also commit a second revision on branch `next` (the last shard and the
                    config changed, as a model update changes them); `main` stays the first.
Prints the commit sha (of main).
"""
import json
import os
import random
import subprocess
import sys

LICENSE = """MiniMax Community License (LAB STAND-IN COPY)
This file stands in for the licence text shipped in the MiniMax-M3 repository.
Read the real licence at https://huggingface.co/MiniMaxAI/MiniMax-M3/blob/main/LICENSE.
"""


def git(repo, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="lab", GIT_AUTHOR_EMAIL="lab@example.invalid",
               GIT_COMMITTER_NAME="lab", GIT_COMMITTER_EMAIL="lab@example.invalid",
               GIT_AUTHOR_DATE="2026-06-01T00:00:00Z", GIT_COMMITTER_DATE="2026-06-01T00:00:00Z")
    return subprocess.run(["git", "-C", repo, *args], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


def main():
    repo, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    tamper = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--tamper-shard" else None
    next_revision = len(sys.argv) > 3 and sys.argv[3] == "--next-revision"
    if os.path.isdir(os.path.join(repo, ".git")):
        print(git(repo, "rev-parse", "HEAD"))
        return
    os.makedirs(repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "lfs", "install", "--local")
    rng = random.Random(20260601)
    n = len(sizes)
    files = {
        ".gitattributes": "*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "LICENSE": LICENSE,
        "README.md": "# tiny-m3 (lab stand-in for MiniMax-M3)\n",
        "config.json": json.dumps({"architectures": ["MiniMaxM3ForCausalLM"], "auto_map": {
            "AutoConfig": "configuration_minimax_m3.MiniMaxM3Config"}, "hidden_size": 64}, indent=2) + "\n",
        "configuration_minimax_m3.py": "class MiniMaxM3Config:\n    model_type = 'minimax_m3'\n",
        "modeling_minimax_m3.py": "class MiniMaxM3ForCausalLM:\n    pass\n",
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}) + "\n",
        "tokenizer_config.json": json.dumps({"model_max_length": 4096}) + "\n",
        "model.safetensors.index.json": json.dumps({"weight_map": {
            "w%d" % i: "model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)}}, indent=2) + "\n",
    }
    for name, text in files.items():
        with open(os.path.join(repo, name), "w") as f:
            f.write(text)
    for i, size in enumerate(sizes):
        with open(os.path.join(repo, "model-%05d-of-%05d.safetensors" % (i + 1, n)), "wb") as f:
            f.write(rng.randbytes(size))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tiny-m3 lab stand-in")
    if next_revision:
        git(repo, "checkout", "-q", "-b", "next")
        with open(os.path.join(repo, "model-%05d-of-%05d.safetensors" % (n, n)), "wb") as f:
            f.write(rng.randbytes(sizes[-1]))
        with open(os.path.join(repo, "config.json"), "w") as f:
            f.write(files["config.json"].replace('"hidden_size": 64', '"hidden_size": 64,\n  "revision_note": "next"'))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "tiny-m3 lab stand-in, next revision")
        git(repo, "checkout", "-q", "main")
    if tamper is not None:
        name = "model-%05d-of-%05d.safetensors" % (tamper, n)
        oid = git(repo, "lfs", "ls-files", "-l", "-I", name).split()[0]
        obj = os.path.join(repo, ".git", "lfs", "objects", oid[:2], oid[2:4], oid)
        os.chmod(obj, 0o644)
        with open(obj, "r+b") as f:
            data = bytearray(f.read())
            data[len(data) // 2] ^= 0xFF
            f.seek(0)
            f.write(data)
    print(git(repo, "rev-parse", "HEAD"))


if __name__ == "__main__":
    main()
