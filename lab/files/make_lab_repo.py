#!/usr/bin/env python3
"""Turn the locally built tiny model (tests/fixtures/tiny-m3) into a hub repository for the
lab's hub mirror (olah), at a reproducible commit.

A STAND-IN for MiniMaxAI/MiniMax-M3-MXFP8: the same kinds of files as the real repository
(safetensors in git-lfs, a remote-code *.py, configs, tokenizer, LICENSE), 2 MB instead of
444 GB. Fixed author/committer and dates make the commit sha identical on every machine, so
the lab inventory pins it like a real revision.

usage: make_lab_repo.py SOURCE_DIR REPO_DIR              (prints the commit sha)
       make_lab_repo.py SOURCE_DIR REPO_DIR --revision 2 (publishes the second revision on top)

The second revision (lab/rollout.yml publishes it for the release drill) is what a model
repository's next commit often is: the same weights with an updated model card and generation
defaults (here max_new_tokens, which the engine reads as its default output cap). Its commit is
as reproducible as the first, so inventories/lab pins it too (lab_rollout_revision).
"""
import json
import os
import shutil
import subprocess
import sys

LICENSE = """MiniMax Community License (LAB STAND-IN COPY)
This file stands in for the licence text shipped in the MiniMax-M3 repository; the lab's
tiny model is test data, not MiniMax-M3. Read the real licence at
https://huggingface.co/MiniMaxAI/MiniMax-M3/blob/main/LICENSE before any real use.
"""

REMOTE_CODE = '''"""Stand-in for the remote code the real repository ships (--trust-remote-code): the lab's
tiny model is a plain Llama and never imports this file; it is here so that the manifest,
the sync and the verification treat *.py files as part of the weights."""
MODEL_TYPE = "llama"
'''


CARD_2 = """
## Revision 2 (lab release drill)

Same weights as revision 1. generation_config.json caps a default generation at 256 new tokens.
"""


def git(repo, *args, date="2026-06-01T00:00:00Z"):
    env = dict(os.environ, GIT_AUTHOR_NAME="mm3-lab", GIT_AUTHOR_EMAIL="lab@example.invalid",
               GIT_COMMITTER_NAME="mm3-lab", GIT_COMMITTER_EMAIL="lab@example.invalid",
               GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(["git", "-C", repo, *args], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


def second_revision(repo):
    """Commit revision 2 on top of revision 1 (once: a repository already there is left as is)."""
    if git(repo, "rev-list", "--count", "HEAD") != "1":
        return
    with open(os.path.join(repo, "README.md"), "a") as f:
        f.write(CARD_2)
    path = os.path.join(repo, "generation_config.json")
    with open(path) as f:
        config = json.load(f)
    config["max_new_tokens"] = 256
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tiny-m3: model card, default max_new_tokens", date="2026-07-01T00:00:00Z")


def main():
    source, repo = sys.argv[1], sys.argv[2]
    revision = sys.argv[4] if len(sys.argv) == 5 and sys.argv[3] == "--revision" else "1"
    if revision not in ("1", "2"):
        sys.exit("usage: make_lab_repo.py SOURCE_DIR REPO_DIR [--revision 2]")
    if os.path.isdir(os.path.join(repo, ".git")):
        if revision == "2":
            second_revision(repo)
        print(git(repo, "rev-parse", "HEAD"))
        return
    os.makedirs(repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "lfs", "install", "--local")
    for name in sorted(os.listdir(source)):
        shutil.copyfile(os.path.join(source, name), os.path.join(repo, name))
    files = {
        ".gitattributes": "*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "LICENSE": LICENSE,
        "configuration_tiny_m3.py": REMOTE_CODE,
    }
    for name, text in files.items():
        with open(os.path.join(repo, name), "w") as f:
            f.write(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tiny-m3: lab stand-in for MiniMax-M3")
    if revision == "2":
        second_revision(repo)
    print(git(repo, "rev-parse", "HEAD"))


if __name__ == "__main__":
    main()
