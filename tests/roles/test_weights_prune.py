"""weights_sync's prune step (roles/weights_sync/tasks/prune.yml, included from the role as the
pull includes it) on a real directory of revisions on the controller: it removes what nothing
names, keeps the revision being synced, the ones `current` and `serving` name, and one that
another run holds the sync lock of (issue 32: a run for revision Y deleted revision X while
another run was pulling X under X's lock)."""
import pathlib

from helpers import run_playbook

A, B, C, D = ("a" * 40, "b" * 40, "c" * 40, "d" * 40)


def _revision(repo, rev):
    (repo / rev).mkdir()
    (repo / rev / "model.safetensors").write_bytes(b"x")
    for suffix in (".verified.json", ".manifest.sha256"):
        (repo / (rev + suffix)).write_text("{}")


def test_prune_keeps_named_and_locked_revisions_and_removes_the_rest(tmp_path):
    root = tmp_path / "weights"
    repo = root / "org" / "model"
    repo.mkdir(parents=True)
    for rev in (A, B, C, D):
        _revision(repo, rev)
    (repo / "current").symlink_to(B)
    (repo / "previous").symlink_to(D)
    # another run is pulling C: its lock, as client.yml takes it (mkdir)
    (repo / (".%s.sync-lock" % C)).mkdir()
    (tmp_path / "play.yml").write_text("""
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Prune as the pull does
      ansible.builtin.include_role:
        name: weights_sync
        tasks_from: prune.yml
""")
    runner, text = run_playbook(str(tmp_path / "play.yml"), tmp_path, extravars={
        "weights_sync_root": str(root), "weights_sync_repo": "org/model", "weights_sync_revision": A})
    assert runner.rc == 0, text[-2000:]
    left = sorted(p.name for p in repo.iterdir())
    assert (repo / C).is_dir() and (repo / (C + ".verified.json")).exists(), left
    assert (repo / A).is_dir() and (repo / B).is_dir(), left
    # D was named only by `previous`: it goes, with its records and the link
    assert not (repo / D).exists() and not (repo / (D + ".verified.json")).exists(), left
    assert not (repo / "previous").is_symlink(), left
    assert (repo / (".%s.sync-lock" % C)).is_dir()
