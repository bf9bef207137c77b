"""Helpers (no tests) for the task-side tests: tiny tasks, a "fine-tuned" teacher, a student, a kd recipe."""

import json
import random
from pathlib import Path

import torch
from transformers import AutoModelForMaskedLM, MPNetConfig, MPNetForMaskedLM, MPNetModel

from biodistil.config import ArchitectureConfig, validate_recipe
from biodistil.data.synthetic import write_ner_task
from biodistil.kd.recipe import KDRecipe
from biodistil.models.loading import load_tokenizer
from biodistil.models.student import model_from_architecture
from biodistil.tasks.classifier import build_classifier
from biodistil.tasks.registry import TaskSpec, get_task

POSITIVE = ("protein", "kinase", "gene", "receptor", "binding")
OTHER = ("cell", "tumour", "patients", "mutation", "disease", "cancer", "mice", "levels", "therapy", "dose")


def write_pair_task(folder: Path, sizes: dict[str, int] | None = None, seed: int = 0) -> Path:
    """A yes/no question + passage task in BLURB JSON lines; "yes" when the passage holds a POSITIVE word."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, size in (sizes or {"train": 48, "dev": 16, "test": 24}).items():
        rows = []
        for index in range(size):
            answer = index % 2 == 0
            words = [rng.choice(OTHER) for _ in range(rng.randint(6, 12))]
            if answer:
                words.insert(rng.randrange(len(words)), rng.choice(POSITIVE))
            question = "is " + " ".join(rng.choice(OTHER) for _ in range(3))
            rows.append({"id": f"{split}-{index}", "sentence1": question, "sentence2": " ".join(words),
                         "label": "yes" if answer else "no"})
        path = folder / f"{split}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        files[split] = str(path)
    spec = folder / "tiny_qa.yaml"
    spec.write_text(json.dumps({"name": "tiny_qa", "kind": "sequence_classification", "format": "blurb_jsonl",
                                "files": files, "labels": ["yes", "no"], "metric": "accuracy_auroc",
                                "metric_options": {"positive": "yes"}, "max_length": 48}), encoding="utf-8")
    return spec


def write_token_task(folder: Path, seed: int = 0, sizes: dict[str, int] | None = None) -> Path:
    """A tiny NER task (BioBERT TSV): POSITIVE words are entities (B, and I when two follow each other)."""
    return write_ner_task(folder, "tiny_ner", POSITIVE, OTHER, sizes or {"train": 24, "test": 12}, seed=seed)


def save_teacher(teacher_dir: Path, task: TaskSpec, target: Path, seed: int = 0) -> Path:
    """A classifier with the task's head on the tiny teacher (random head: enough to test the mechanics)."""
    torch.manual_seed(seed)
    model = build_classifier(teacher_dir, task)
    model.save_pretrained(target)
    load_tokenizer(str(teacher_dir)).save_pretrained(target)
    return target


def save_student(tokenizer, target: Path, layers: int = 2, dropout: float = 0.1, positions: int = 64) -> Path:
    """A 2-layer (by default), 32-wide BERT encoder with the teacher's tokenizer."""
    torch.manual_seed(1)
    arch = ArchitectureConfig(num_layers=layers, hidden_size=32, num_heads=2, intermediate_size=64,
                              max_position_embeddings=positions, dropout=dropout)
    model = model_from_architecture(arch, tokenizer)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def save_mpnet(tokenizer, target: Path, layers: int, positions: int, head: bool = True) -> Path:
    """A 32-wide MPNet with `tokenizer` (random weights): a masked LM, or with `head` False an encoder alone, as
    `mpnet-base` is."""
    config = MPNetConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=positions, pad_token_id=tokenizer.pad_token_id)
    (MPNetForMaskedLM if head else MPNetModel)(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def no_dropout_copy(folder: Path, target: Path) -> Path:
    """The model of `folder` with dropout 0 (for exact gradient comparisons)."""
    model = AutoModelForMaskedLM.from_pretrained(folder)
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = 0.0
    model.save_pretrained(target)
    load_tokenizer(str(folder)).save_pretrained(target)
    return target


def tiny_task(path: Path) -> TaskSpec:
    return get_task(str(path))


def kd_recipe(task_file, teacher, student, out, **sections) -> KDRecipe:
    """A small kd recipe (Hinton KD at T = 2, 2 epochs, cache beside `out`); `sections` update its sections;
    `teacher` a list of {name_or_path, weight}: several teachers."""
    teachers = {"teachers": teacher} if isinstance(teacher, list) else {"teacher": {"name_or_path": str(teacher)}}
    raw = {"run": {"output_dir": str(out), "seed": 3}, **teachers,
           "student": {"name_or_path": str(student)}, "task": {"name": str(task_file)},
           "kd": {"soft_loss": "hinton", "temperature": 2.0, "epochs": 2, "cache_dir": str(out.parent / "cache")},
           "train": {"batch_size": 8, "learning_rate": 1e-3, "save_every": 0, "eval_every": 0, "log_every": 1,
                     "tensorboard": False, "progress_bar": False}}
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return validate_recipe(KDRecipe, raw)
