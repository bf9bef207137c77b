"""Transfer sets: the inputs a student learns a teacher's outputs on, built from a recipe and saved as datasets.

Kinds (see `SourceConfig`): the task's own training inputs (in-domain), another task's split, a task file of a
known format (e.g. BoolQ question/passage pairs), plain text (e.g. Wikipedia sentences), or a randomized set
sampled from the unigram model of any of these (`biodistil.kd.random_text`). Examples are shaped to the target
task: word lists for token tasks, (text, text_pair) for pair tasks, single texts otherwise. Gold labels are
dropped unless `keep_labels` (the fine-tune baseline and the CE term need them); `label_map` maps a source's
labels into the task's label space (BoolQ true/false is read as yes/no; PubMedQA's "maybe" can be dropped).

A saved set is a datasets Arrow folder `data/` plus `transfer.json` (what it is, its size and fingerprint).
"""

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa

from biodistil.data.formats import Example, TextExample, TokenExample, fingerprint_examples, read_examples
from biodistil.data.paths import resolve_data_root
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory, read_json
from biodistil.kd.random_text import UnigramModel, random_pairs, random_passages
from biodistil.kd.recipe import RandomConfig, SourceConfig, TransferConfig, TransferRecipe
from biodistil.tasks.recipe import task_spec
from biodistil.tasks.registry import TaskSpec, get_task
from biodistil.tasks.splits import read_split, seeded_subset
from biodistil.training.run import RunFolder

FORMAT_VERSION = 1
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")

TEXT_FEATURES = datasets.Features({
    "id": datasets.Value("string"), "text": datasets.Value("string"), "text_pair": datasets.Value("string"),
    "label": datasets.Value("string"), "label_vector": datasets.List(datasets.Value("int8")),
})
TOKEN_FEATURES = datasets.Features({
    "id": datasets.Value("string"), "tokens": datasets.List(datasets.Value("string")),
    "tags": datasets.List(datasets.Value("string")),
})


# ------------------------------------------------------------------------------------------- building


def build_transfer_set(cfg: TransferConfig, task: TaskSpec, data_root: str | Path | None = None,
                       fold: int | None = None, task_max_examples: int | None = None) -> list[Example]:
    """The transfer examples for `task` described by `cfg`, deterministic for the recipe. `task_max_examples` (the
    recipe's `task.max_examples`) caps an in-domain source as it caps every other use of the task's splits."""
    pairs = cfg.pairs if cfg.pairs is not None else is_pair_task(task, data_root, fold)
    examples = read_source(cfg.source, task, data_root, fold, task_max_examples)
    if cfg.budget_beside_source():
        budget = budget_alone(task, cfg, pairs, data_root, fold, task_max_examples)
        return [*budget, *unlabelled_source(examples, cfg, task, pairs)]
    if cfg.random is not None:
        return randomize(examples, cfg.random, task, pairs)
    shaped = shape_for_task(examples, task, pairs)
    if not cfg.keep_labels:
        return [unlabelled(example) for example in shaped]
    if cfg.labelled is not None:
        return labelled_budget(shaped, task, cfg, fold)
    return map_labels(shaped, task, cfg.label_map, describe_source(cfg.source))


def labelled_budget(examples: Sequence[Example], task: TaskSpec, cfg: TransferConfig,
                    fold: int | None) -> list[Example]:
    """The training split with the gold labels of its labelled budget (`cfg.labelled` examples: the seeded subset
    `task.train_examples` fine-tunes on, drawn with the same key) and none on the rest."""
    if task.kind == "multilabel_classification":
        raise BiodistilError(f"transfer.labelled: task {task.name} is multi-label, whose label vectors cannot be "
                             "left out per example; give the labelled examples as a transfer set of their own")
    keep = set(seeded_subset(range(len(examples)), cfg.labelled, f"{task.name}/train/{fold}"))
    labelled = map_labels([examples[i] for i in sorted(keep)], task, cfg.label_map, describe_source(cfg.source))
    if len(labelled) != len(keep):
        raise BiodistilError("transfer.labelled: transfer.label_map drops examples of the labelled budget; a budget "
                             "keeps every label")
    by_index = dict(zip(sorted(keep), labelled, strict=True))
    return [by_index.get(i) or unlabelled(example) for i, example in enumerate(examples)]


def budget_alone(task: TaskSpec, cfg: TransferConfig, pairs: bool, data_root: str | Path | None,
                 fold: int | None, task_max_examples: int | None) -> list[Example]:
    """The labelled budget by itself: the seeded `cfg.labelled` training examples (those `task.train_examples`
    fine-tunes on) with their gold labels, in the task's own label space."""
    whole = TransferConfig(keep_labels=True, labelled=cfg.labelled)
    train = read_source(whole.source, task, data_root, fold, task_max_examples)
    return [example for example in labelled_budget(shape_for_task(train, task, pairs), task, whole, fold)
            if is_labelled(example)]


def unlabelled_source(examples: Sequence[Example], cfg: TransferConfig, task: TaskSpec, pairs: bool,
                      ) -> list[Example]:
    """A source's examples shaped for the task (randomized when asked) without their labels; ids prefixed so they
    never collide with the budget's."""
    shaped = randomize(examples, cfg.random, task, pairs) if cfg.random else shape_for_task(examples, task, pairs)
    return [replace(unlabelled(example), id=f"transfer-{example.id}") for example in shaped]


def read_source(source: SourceConfig, task: TaskSpec, data_root: str | Path | None,
                fold: int | None = None, task_max_examples: int | None = None) -> list[Example]:
    """The raw examples of a source, in file order, capped at `max_examples` (an in-domain source also at the task's
    own cap, `task_max_examples`: the same seeded subset fine-tuning reads)."""
    limit = source.max_examples
    if source.kind == "in_domain":
        caps = [cap for cap in (limit, task_max_examples) if cap is not None]
        examples = read_split(task, source.split, data_root, fold, min(caps) if caps else None)
    elif source.kind == "task":
        examples = read_split(get_task(source.task), source.split, data_root, None, limit)
    elif source.kind == "text":
        examples = read_text_units(_data_file(source.path, data_root), source.sentences, limit)
    else:
        if source.kind == "file":
            examples = read_examples(source.format, _data_file(source.path, data_root), **source.reader_options)
        else:
            examples = load_transfer_set(source.path)
        examples = seeded_subset(examples, limit, describe_source(source))
    if not examples:
        raise BiodistilError(f"Transfer source {describe_source(source)} holds no examples")
    return list(examples)


def describe_source(source: SourceConfig) -> str:
    detail = {"in_domain": "", "task": f" {source.task}", "file": f" {source.path} ({source.format})",
              "text": f" {source.path}", "saved": f" {source.path}"}[source.kind]
    split = f" [{source.split}]" if source.kind in ("in_domain", "task") else ""
    return f"{source.kind}{detail}{split}"


def describe_transfer(cfg: TransferConfig) -> str:
    """The source, whether it is randomized, and a labelled budget added beside it."""
    described = describe_source(cfg.source) + (" randomized" if cfg.random is not None else "")
    if cfg.budget_beside_source():
        described += f" + a labelled budget of {cfg.labelled:,} training examples"
    return described


def _data_file(path: str, data_root: str | Path | None) -> Path:
    candidate = Path(path).expanduser()
    if not candidate.is_absolute():
        candidate = resolve_data_root(data_root) / candidate
    if not candidate.is_file():
        raise BiodistilError(f"Transfer source file {candidate} not found (transfer.source.path, relative to the "
                             "data folder unless absolute)")
    return candidate


def read_text_units(path: Path, sentences: bool, limit: int | None) -> list[TextExample]:
    """Unlabelled texts from a plain-text file: one per non-blank line, or per sentence of each line."""
    units: list[TextExample] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            for text in (_SENTENCE_END.split(line) if sentences else [line]) if line else []:
                if text.strip():
                    units.append(TextExample(str(len(units)), text.strip(), None, None))
                if limit is not None and len(units) >= limit:
                    return units
    return units


def is_pair_task(task: TaskSpec, data_root: str | Path | None, fold: int | None = None) -> bool:
    """Whether the task's inputs are text pairs, read from its training data."""
    if task.kind == "token_classification":
        return False
    try:
        first = task.load_split("train", data_root, fold)[:1]
    except BiodistilError as err:
        if task.is_available(data_root):
            raise  # the file is there but malformed: the error names its file and line
        raise BiodistilError(f"Cannot tell whether task {task.name} takes text pairs: its training split is absent "
                             f"({err}); set transfer.pairs: true or false") from None
    return bool(first) and first[0].text_pair is not None


def shape_for_task(examples: Sequence[Example], task: TaskSpec, pairs: bool) -> list[Example]:
    """Word lists for token tasks; (text, text_pair) for pair tasks (single texts paired with the next one);
    single texts otherwise (a pair's two segments joined)."""
    if task.kind == "token_classification":
        return [_as_tokens(example) for example in examples]
    texts = [_as_text(example) for example in examples]
    if not pairs:
        return [_joined(example) for example in texts]
    if all(example.text_pair is not None for example in texts):
        return texts
    return [TextExample(first.id, first.text, second.text, first.label)
            for first, second in zip(texts[0::2], texts[1::2], strict=False)]


def _as_tokens(example: Example) -> TokenExample:
    if isinstance(example, TokenExample):
        return example
    words = f"{example.text} {example.text_pair or ''}".split()
    return TokenExample(example.id, words, [])


def _as_text(example: Example) -> TextExample:
    if isinstance(example, TextExample):
        return example
    return TextExample(example.id, " ".join(example.tokens), None, None)


def _joined(example: TextExample) -> TextExample:
    if example.text_pair is None:
        return example
    return TextExample(example.id, f"{example.text} {example.text_pair}", None, example.label)


def unlabelled(example: Example) -> Example:
    if isinstance(example, TokenExample):
        return TokenExample(example.id, example.tokens, [])
    return TextExample(example.id, example.text, example.text_pair, None)


def map_labels(examples: Sequence[Example], task: TaskSpec, label_map: dict[str, str | None],
               where: str) -> list[Example]:
    """Gold labels in the task's label space; a label mapped to None drops its example."""
    kept: list[Example] = []
    for example in examples:
        mapped = _mapped_label(example, task, label_map, where)
        if mapped is not _DROP:
            kept.append(mapped)
    if not kept:
        raise BiodistilError(f"Transfer source {where}: no labelled example is left after transfer.label_map")
    return kept


_DROP = object()


def _mapped_label(example: Example, task: TaskSpec, label_map: dict[str, str | None], where: str) -> Any:
    if isinstance(example, TokenExample):
        if not example.tags:
            raise _no_labels(where)
        return TokenExample(example.id, example.tokens, [_one_label(t, task, label_map, where) for t in example.tags])
    if example.label is None:
        raise _no_labels(where)
    if isinstance(example.label, list):
        if task.kind != "multilabel_classification" or len(example.label) != task.num_labels:
            raise BiodistilError(f"Transfer source {where}: example {example.id} has a label vector of "
                                 f"{len(example.label)} values; task {task.name} expects a single label")
        return example
    if example.label in label_map and label_map[example.label] is None:
        return _DROP
    return TextExample(example.id, example.text, example.text_pair,
                       _one_label(example.label, task, label_map, where))


def _one_label(label: str, task: TaskSpec, label_map: dict[str, str | None], where: str) -> str:
    mapped = label_map.get(label, label)
    if mapped not in task.label_to_id:
        raise BiodistilError(f"Transfer source {where}: label '{label}' is not a label of task {task.name} "
                             f"({', '.join(task.labels)}); map it with transfer.label_map (null drops the example)")
    return mapped


def _no_labels(where: str) -> BiodistilError:
    return BiodistilError(f"Transfer source {where} has unlabelled examples; transfer.keep_labels needs gold labels")


def randomize(examples: Sequence[Example], cfg: RandomConfig, task: TaskSpec, pairs: bool) -> list[Example]:
    """Random examples from the unigram model of the source passages (the pair's second segment when present).

    Pair tasks: questions = starter + uniform words, passages ~ unigram; single texts: passages; token tasks:
    passages as word lists. Only source words (and the starters) appear.
    """
    passages = [_passage_of(example) for example in examples]
    model = UnigramModel.from_passages(passages, lowercase=cfg.lowercase)
    if pairs:
        drawn = random_pairs(model, cfg.size, cfg.question_length, cfg.passage_length, cfg.seed, cfg.starters)
        return [TextExample(f"random-{i}", q, p, None) for i, (q, p) in enumerate(drawn)]
    texts = random_passages(model, cfg.size, cfg.passage_length, cfg.seed)
    if task.kind == "token_classification":
        return [TokenExample(f"random-{i}", text.split(), []) for i, text in enumerate(texts)]
    return [TextExample(f"random-{i}", text, None, None) for i, text in enumerate(texts)]


def _passage_of(example: Example) -> str:
    if isinstance(example, TokenExample):
        return " ".join(example.tokens)
    return example.text_pair if example.text_pair is not None else example.text


# ---------------------------------------------------------------------------------------- storage


def is_labelled(example: Example) -> bool:
    return bool(example.tags) if isinstance(example, TokenExample) else example.label is not None


def examples_to_dataset(examples: Sequence[Example]) -> datasets.Dataset:
    """A datasets table of the examples (token or text schema)."""
    if examples and isinstance(examples[0], TokenExample):
        rows = [{"id": e.id, "tokens": list(e.tokens), "tags": list(e.tags)} for e in examples]
        return datasets.Dataset.from_list(rows, features=TOKEN_FEATURES)
    rows = [{"id": e.id, "text": e.text, "text_pair": e.text_pair,
             "label": e.label if isinstance(e.label, str) else None,
             "label_vector": e.label if isinstance(e.label, list) else None} for e in examples]
    return datasets.Dataset.from_list(rows, features=TEXT_FEATURES)


def dataset_to_examples(table: datasets.Dataset) -> list[Example]:
    if "tokens" in table.column_names:
        return [TokenExample(row["id"], row["tokens"], row["tags"] or []) for row in table]
    return [TextExample(row["id"], row["text"], row["text_pair"],
                        row["label"] if row["label_vector"] is None else list(row["label_vector"]))
            for row in table]


def save_transfer_set(examples: Sequence[Example], folder: Path, info: dict[str, Any]) -> Path:
    """Write the set atomically: `folder/data` (Arrow) and `folder/transfer.json` (info, size, fingerprint)."""
    if not examples:
        raise BiodistilError(f"Refusing to save an empty transfer set to {folder}")
    meta = {**info, "size": len(examples), "fingerprint": fingerprint_examples(examples),
            "labelled": all(is_labelled(e) for e in examples), "format_version": FORMAT_VERSION}

    def fill(tmp: Path) -> None:
        examples_to_dataset(examples).save_to_disk(str(tmp / "data"))
        (tmp / "transfer.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    atomic_directory(Path(folder), fill)
    return Path(folder)


def load_transfer_set(folder: str | Path) -> list[Example]:
    """A transfer set saved by `save_transfer_set` (or `biodistil transfer`): the folder or its `data/`."""
    folder = Path(folder).expanduser()
    if (folder / "transfer_set" / "transfer.json").is_file():
        folder = folder / "transfer_set"
    if not (folder / "transfer.json").is_file() or not (folder / "data").is_dir():
        raise BiodistilError(f"{folder} is not a saved transfer set (expected transfer.json and data/ written by "
                             "`biodistil transfer`)")
    advice = "build the transfer set again (`biodistil transfer` with its recipe, into an empty folder)"
    read_json(folder / "transfer.json", "transfer set's description", advice)
    try:
        return dataset_to_examples(datasets.load_from_disk(str(folder / "data")))
    except (OSError, ValueError, pa.ArrowException) as err:  # pyarrow's ArrowInvalid is a ValueError too
        raise BiodistilError(f"{folder / 'data'}: the transfer set is damaged ({type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}); {advice}") from None


# ---------------------------------------------------------------------------------------- command


def run_transfer(recipe: TransferRecipe) -> Path:
    """`biodistil transfer`: build the recipe's transfer set and save it under `<run>/transfer_set`."""
    run = RunFolder(recipe.run.output_dir, recipe)
    task = task_spec(recipe.task)
    examples = build_transfer_set(recipe.transfer, task, recipe.task.data_dir, recipe.task.fold,
                                  recipe.task.max_examples)
    info = {"task": task.name, "source": describe_source(recipe.transfer.source),
            "randomized": recipe.transfer.random is not None,
            "transfer": recipe.transfer.model_dump(mode="json")}
    target = save_transfer_set(examples, run.path / "transfer_set", info)
    preview = [examples_to_dataset([e])[0] for e in examples[:5]]
    run.write_summary({**read_json(target / "transfer.json"), "preview": preview})
    return target
