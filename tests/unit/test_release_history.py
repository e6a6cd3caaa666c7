"""Unit tests of the release_history module: pure functions directly, main() with ansible-core's
patch_module_args on real files in a temporary directory (no mocks of the file system)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from helpers import load_source  # tests/ is on sys.path (pytest.ini)

from ansible.module_utils.testing import patch_module_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
mod = load_source("release_history", os.path.join(ROOT, "library", "release_history.py"))

A = {"minimax-m3.service": "1" * 64, "docker-run.cmd": "2" * 64}
B = {"minimax-m3.service": "1" * 64, "docker-run.cmd": "3" * 64}


def test_release_id_depends_on_every_file_and_not_on_order():
    assert mod.release_id(A) == mod.release_id(dict(reversed(list(A.items()))))
    assert mod.release_id(A) != mod.release_id(B)
    assert mod.release_id(A) != mod.release_id({"minimax-m3.service": "1" * 64})
    assert len(mod.release_id(A)) == 16


def test_same_files_append_nothing():
    entries, recorded = mod.next_history([], A, {"revision": "r1"}, "alice", "serving", "T1")
    again, recorded2 = mod.next_history(entries, A, {"revision": "other display"}, "bob", "serving", "T2")
    assert recorded and not recorded2 and again == entries
    assert entries[0]["by"] == "alice" and entries[0]["until"] is None


def test_a_change_closes_the_last_entry_and_appends_one():
    first, _ = mod.next_history([], A, {"revision": "r1"}, "alice", "serving", "T1")
    second, recorded = mod.next_history(first, B, {"revision": "r2"}, "bob", "serving", "T2")
    assert recorded and len(second) == 2
    assert second[0]["until"] == "T2" and second[1]["from"] == "T2" and second[1]["by"] == "bob"
    assert first[0]["until"] is None          # pure: the input is not changed
    # back to A (a rollback): a new entry, the history keeps both
    third, _ = mod.next_history(second, A, {}, "carol", "serving", "T3")
    assert [e["id"] for e in third] == [mod.release_id(A), mod.release_id(B), mod.release_id(A)]


def test_kept_ids_are_the_newest_distinct_and_never_fewer_than_two():
    entries = [{"id": i} for i in ["a", "b", "a", "c", "d"]]
    assert mod.kept_ids(entries, 3) == ["d", "c", "a"]
    assert mod.kept_ids(entries, 1) == ["d", "c"]


@pytest.mark.parametrize("text", ["[]", '{"releases": {}}', '{"releases": [{"x": 1}]}', "not json"])
def test_a_file_that_is_not_a_history_is_refused(text):
    with pytest.raises(ValueError):
        mod.load_history(text)


def run(capsys, check=False, **args):
    if check:
        args["_ansible_check_mode"] = True
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exc:
            mod.main()
    out = json.loads(capsys.readouterr().out)
    out["rc"] = exc.value.code
    return out


def _release_files(tmp_path, cmd):
    unit = tmp_path / "minimax-m3.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/docker run image@sha256:x\n")
    command = tmp_path / "docker-run.cmd"
    command.write_text(cmd)
    return [str(unit), str(command)]


def test_main_records_keeps_copies_and_is_idempotent(tmp_path, capsys):
    hist, store = str(tmp_path / "releases.json"), str(tmp_path / "store")
    files = _release_files(tmp_path, "docker run --model-path /w/r1\n")
    args = dict(path=hist, store_dir=store, files=files, release={"revision": "r1"}, by="alice")
    first = run(capsys, **args)
    assert first["changed"] and first["recorded"] and first["previous"] is None and first["entries"] == 1
    rid = first["current"]["id"]
    copy = os.path.join(store, rid, "docker-run.cmd")
    assert open(copy).read() == "docker run --model-path /w/r1\n"
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(hist).st_mode) == 0o600
    again = run(capsys, **args)
    assert not again["changed"] and again["current"] == first["current"]


def test_main_check_mode_writes_nothing(tmp_path, capsys):
    hist, store = str(tmp_path / "releases.json"), str(tmp_path / "store")
    files = _release_files(tmp_path, "docker run\n")
    out = run(capsys, check=True, path=hist, store_dir=store, files=files)
    assert out["changed"] and out["recorded"]
    assert not os.path.exists(hist) and not os.path.exists(store)


def test_main_a_changed_flag_is_a_new_release_with_the_old_as_previous(tmp_path, capsys):
    hist, store = str(tmp_path / "releases.json"), str(tmp_path / "store")
    files = _release_files(tmp_path, "docker run --max-num-seqs 8\n")
    first = run(capsys, path=hist, store_dir=store, files=files, by="alice")
    files = _release_files(tmp_path, "docker run --max-num-seqs 16\n")
    second = run(capsys, path=hist, store_dir=store, files=files, by="bob", keep=2)
    assert second["recorded"] and second["previous"]["id"] == first["current"]["id"]
    assert second["previous"]["until"] == second["current"]["from"]
    # the previous release's files stay on disk for a rollback without a transfer
    assert open(os.path.join(store, first["current"]["id"], "docker-run.cmd")).read() == "docker run --max-num-seqs 8\n"
    files = _release_files(tmp_path, "docker run --max-num-seqs 32\n")
    third = run(capsys, path=hist, store_dir=store, files=files, keep=2)
    assert sorted(os.listdir(store)) == sorted([second["current"]["id"], third["current"]["id"]])
    assert third["entries"] == 3


def test_main_refuses_a_missing_file_and_a_broken_history(tmp_path, capsys):
    hist, store = tmp_path / "releases.json", str(tmp_path / "store")
    out = run(capsys, path=str(hist), store_dir=store, files=[str(tmp_path / "nope.service")])
    assert out.get("failed") and "missing" in out["msg"]
    hist.write_text("{broken")
    files = _release_files(tmp_path, "docker run\n")
    out = run(capsys, path=str(hist), store_dir=store, files=files)
    assert out.get("failed") and "Move it aside" in out["msg"] and hist.read_text() == "{broken"
