"""The teacher store's task entries: keyed by what the teacher is (its files, never its name) and the transfer set
(see test_kd_command); damaged entries are found and built again."""

import shutil

import numpy as np
import torch

from biodistil.kd.transfer import unlabelled
from biodistil.models.loading import load_tokenizer
from biodistil.teachers import task_cache
from biodistil.teachers.loading import load_teacher_classifier
from biodistil.teachers.store import teacher_fingerprint


def _changed_teacher(teacher_path, task, folder):
    """The teacher with its classifier bias moved by 1, saved to `folder` (other weights, same config)."""
    changed = load_teacher_classifier(teacher_path, task)
    with torch.no_grad():
        changed.classifier.bias.add_(1.0)
    changed.save_pretrained(folder)
    load_tokenizer(str(teacher_path)).save_pretrained(folder)
    return folder


def test_teacher_fingerprint_follows_the_weights(kd_models, pair_task, tmp_path):
    teacher_path, _ = kd_models
    changed = _changed_teacher(teacher_path, pair_task, tmp_path / "changed")
    assert teacher_fingerprint(teacher_path) == teacher_fingerprint(teacher_path)
    assert teacher_fingerprint(changed) != teacher_fingerprint(teacher_path)


def test_a_damaged_cache_entry_is_found_and_built_again(kd_models, pair_task, tmp_path, capsys):
    teacher_path, _ = kd_models
    examples = [unlabelled(e) for e in pair_task.load_split("train")[:12]]
    request = task_cache.TeacherRequest(pair_task)
    first = task_cache.cached_teacher_outputs(teacher_path, examples, request, tmp_path)
    expected = torch.from_numpy(np.array(first.logits))
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    arrow = next(entry.glob("*.arrow"))
    damages = {"truncated": lambda: arrow.write_bytes(arrow.read_bytes()[:50]),
               "garbage": lambda: arrow.write_bytes(b"\x00garbage" * 100),
               "flipped": lambda: arrow.write_bytes(arrow.read_bytes()[:-8] + b"\x01" * 8),
               "no checksum record": lambda: arrow.with_suffix(".json").unlink()}
    for name, damage in damages.items():
        damage()
        capsys.readouterr()
        again = task_cache.cached_teacher_outputs(teacher_path, examples, request, tmp_path)
        assert f"Teacher-output cache {entry} is damaged" in capsys.readouterr().out, name
        assert torch.allclose(torch.from_numpy(np.array(again.logits)), expected, atol=1e-6), f"{name}: same outputs"
    capsys.readouterr()
    task_cache.cached_teacher_outputs(teacher_path, examples, request, tmp_path)
    assert "damaged" not in capsys.readouterr().out, "an intact entry is read as it is"


def _publish(repo, revision: str, folder) -> None:
    """What the Hub's cache holds after a download of `revision` of the model in `folder`."""
    shutil.copytree(folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)


def test_a_hub_teacher_whose_files_change_gets_a_new_cache_entry(kd_models, pair_task, tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    teacher_path, _ = kd_models
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the cache only, as on a machine without network
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--biodistil-test--teacher"
    examples = [unlabelled(e) for e in pair_task.load_split("train")[:6]]
    request = task_cache.TeacherRequest(pair_task, progress_bar=False)
    store = tmp_path / "store"

    _publish(repo, "a" * 40, teacher_path)
    first = teacher_fingerprint("biodistil-test/teacher")
    assert first == teacher_fingerprint(teacher_path), "the same files: the same teacher"
    before = task_cache.cached_teacher_outputs("biodistil-test/teacher", examples, request, store)
    _publish(repo, "b" * 40, _changed_teacher(teacher_path, pair_task, tmp_path / "changed"))  # updated on the Hub
    assert teacher_fingerprint("biodistil-test/teacher") != first, "new files: a new teacher"
    after = task_cache.cached_teacher_outputs("biodistil-test/teacher", examples, request, store)
    assert after.folder != before.folder, "the same name, other files: a new entry"
    assert len([p for p in store.iterdir() if p.name.startswith("task-")]) == 2
    shift = np.array(after.logits) - np.array(before.logits)
    assert np.allclose(shift, 1.0, atol=1e-4), "the new entry holds the updated teacher's outputs"


def test_a_teacher_spelled_two_ways_is_one_teacher(teacher_dir, tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(teacher_dir.parent)
    assert teacher_fingerprint(teacher_dir.name) == teacher_fingerprint(str(teacher_dir))
    moved = shutil.copytree(teacher_dir, tmp_path / "elsewhere")
    config = json.loads((moved / "config.json").read_text())
    config["_name_or_path"] = "/somewhere/else"
    (moved / "config.json").write_text(json.dumps(config, indent=3))
    assert teacher_fingerprint(moved) == teacher_fingerprint(teacher_dir), "where it was saved from is not the teacher"
    config["hidden_dropout_prob"] = 0.5
    (moved / "config.json").write_text(json.dumps(config))
    assert teacher_fingerprint(moved) != teacher_fingerprint(teacher_dir), "its configuration is"
