"""The typed batch every training stage hands the engine: what it keeps from a padded dict, which inputs the teacher
reads, and that moving it moves every part."""

import torch

from biodistil.data.batch import AsBatch, Batch, UnitIds


def test_a_padded_dict_gives_its_model_inputs_and_labels_only():
    collated = {"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.tensor([[1, 1]]),
                "token_type_ids": torch.tensor([[0, 0]]), "labels": torch.tensor([[1, -100]]),
                "block": torch.tensor([3]), "pattern": torch.tensor([0])}
    batch = AsBatch(lambda items: collated)([None])
    assert set(batch.inputs) == {"input_ids", "attention_mask", "token_type_ids"}
    assert torch.equal(batch.labels, collated["labels"]) and batch.masks == {} and batch.teacher == {}
    assert batch.alignment is None and batch.input_ids is collated["input_ids"]
    assert Batch.of({"input_ids": torch.tensor([[1]]), "attention_mask": torch.tensor([[1]])}).labels is None


def test_the_teacher_reads_its_own_tokenization_else_the_students_positions():
    student = {"input_ids": torch.tensor([[1, 2, 3]]), "attention_mask": torch.tensor([[1, 1, 0]]),
               "token_type_ids": torch.tensor([[0, 0, 0]])}
    assert Batch(student).teacher_inputs() == student
    vekd = Batch(student, teachers=[{"input_ids": torch.tensor([[1, 9, 3]])}])  # new ids at the student's positions
    inputs = vekd.teacher_inputs()
    assert inputs["input_ids"].tolist() == [[1, 9, 3]] and inputs["attention_mask"] is student["attention_mask"]
    own = {"input_ids": torch.tensor([[7, 8, 9, 10]]), "attention_mask": torch.tensor([[1, 1, 1, 1]])}
    across = Batch(student, teachers=[{**own, "word_index": torch.tensor([[0, 1, -1]])}])
    assert across.teacher_inputs() == own, "its own tokens only: never the student's token_type_ids"


def test_moving_a_batch_moves_every_part_and_leaves_the_original():
    units = UnitIds(torch.tensor([[0, 1]]), torch.tensor([[0, 1, 1]]), torch.ones(1, 2, dtype=torch.bool),
                    torch.tensor([[False, True]]))
    batch = Batch({"input_ids": torch.tensor([[1, 2]]), "attention_mask": torch.tensor([[1, 1]])},
                  torch.tensor([[1, -100]]), {"kd": torch.tensor([[1, 0]])}, units,
                  [{"logits": torch.zeros(1, 2, 3)}])
    moved = batch.to(torch.device("meta"))
    tensors = [*moved.inputs.values(), moved.labels, *moved.masks.values(), *moved.teacher.values(),
               moved.alignment.student_units, moved.alignment.teacher_units, moved.alignment.unit_mask,
               moved.alignment.word_mask]
    assert all(t.device.type == "meta" for t in tensors) and moved.alignment.chosen is None
    assert batch.input_ids.device.type == "cpu", "a new batch: the original stays where it was"
    changed = batch.replace(labels=None)
    assert changed.labels is None and batch.labels is not None
