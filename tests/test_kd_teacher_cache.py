"""The teacher-output cache: keyed by the teacher's weights (and the transfer set, see test_kd_command)."""

import torch

from biodistil.kd import teacher_cache
from biodistil.kd.teacher_cache import load_teacher_classifier
from biodistil.models.loading import load_tokenizer


def test_teacher_fingerprint_follows_the_weights(kd_models, pair_task, tmp_path):
    teacher_path, _ = kd_models
    changed = load_teacher_classifier(teacher_path, pair_task)
    with torch.no_grad():
        changed.classifier.bias.add_(1.0)
    changed.save_pretrained(tmp_path / "changed")
    load_tokenizer(str(teacher_path)).save_pretrained(tmp_path / "changed")
    assert teacher_cache.model_fingerprint(teacher_path) == teacher_cache.model_fingerprint(teacher_path)
    assert teacher_cache.model_fingerprint(tmp_path / "changed") != teacher_cache.model_fingerprint(teacher_path)


def test_a_damaged_cache_entry_is_found_and_built_again(kd_models, pair_task, tmp_path, capsys):
    from biodistil.kd.transfer import unlabelled

    teacher_path, _ = kd_models
    examples = [unlabelled(e) for e in pair_task.load_split("train")[:12]]
    request = teacher_cache.TeacherRequest(pair_task)
    first = teacher_cache.cached_teacher_outputs(teacher_path, examples, request, tmp_path)
    expected = torch.tensor(first.to_dict()["logits"])
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    arrow = next(entry.glob("*.arrow"))
    damages = {"truncated": lambda: arrow.write_bytes(arrow.read_bytes()[:50]),
               "garbage": lambda: arrow.write_bytes(b"\x00garbage" * 100),
               "flipped": lambda: arrow.write_bytes(arrow.read_bytes()[:-8] + b"\x01" * 8),
               "no state.json": lambda: (entry / "state.json").unlink()}
    for name, damage in damages.items():
        damage()
        capsys.readouterr()
        again = teacher_cache.cached_teacher_outputs(teacher_path, examples, request, tmp_path)
        assert f"Teacher-output cache {entry} is damaged" in capsys.readouterr().out, name
        assert torch.allclose(torch.tensor(again.to_dict()["logits"]), expected, atol=1e-6), f"{name}: the same outputs"
    capsys.readouterr()
    teacher_cache.cached_teacher_outputs(teacher_path, examples, request, tmp_path)
    assert "damaged" not in capsys.readouterr().out, "an intact entry is read as it is"


def test_a_hub_teacher_is_fingerprinted_by_its_files_not_its_name(kd_models, pair_task, tmp_path, monkeypatch):
    import shutil

    import huggingface_hub.constants as hub

    teacher_path, _ = kd_models
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the cache only, as on a machine without network
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--biodistil-test--teacher"

    def publish(revision: str, folder) -> None:  # what the Hub's cache holds after a download of `revision`
        shutil.copytree(folder, repo / "snapshots" / revision)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(revision)

    publish("a" * 40, teacher_path)
    first = teacher_cache.model_fingerprint("biodistil-test/teacher")
    assert first == teacher_cache.model_fingerprint(teacher_path), "the same files: the same teacher"
    changed = load_teacher_classifier(teacher_path, pair_task)
    with torch.no_grad():
        changed.classifier.bias.add_(1.0)
    changed.save_pretrained(tmp_path / "changed")
    load_tokenizer(str(teacher_path)).save_pretrained(tmp_path / "changed")
    publish("b" * 40, tmp_path / "changed")  # the model was updated on the Hub
    assert teacher_cache.model_fingerprint("biodistil-test/teacher") != first, "new files: new cache entries"


def test_a_teacher_spelled_two_ways_has_one_mlm_cache_fingerprint(teacher_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForMaskedLM

    from biodistil.methods.teacher_cache import weights_fingerprint

    monkeypatch.chdir(teacher_dir.parent)
    relative = AutoModelForMaskedLM.from_pretrained(teacher_dir.name)
    absolute = AutoModelForMaskedLM.from_pretrained(str(teacher_dir))
    assert relative.config._name_or_path != absolute.config._name_or_path
    assert weights_fingerprint(relative) == weights_fingerprint(absolute)
