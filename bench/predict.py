"""Speed and memory of `biodistil predict` (the `Predictor` code path) on real sentences, teacher against student.

    python bench/predict.py runs/demo/study/ncbi_disease/teacher/model runs/demo/student-onnx --threads 1

Reads the first `--sentences` sentences of corpus/biomed.txt (the data folder's; lines split at sentence ends) and
runs each MODEL on them through `write_predictions` (the command's writer, output to a temporary file), one model at
a time in this process, in the order given, the first being the reference. Per model: records/s, its ratio to the
reference, the share of the wall time spent outside the model's forward calls (tokenising, windowing, word and
character offsets, JSON writing: the `predict` overhead), and peak memory (ru_maxrss of a fresh child process that
predicts half the sentences, then of one that predicts all of them: a peak that does not grow with the input's size
is the same twice). MODEL: a model folder (PyTorch fp32), an export folder (`--runtime`, default auto: its int8 graph)
or NAME=PATH. Prints a table and, last, one JSON line. Tests never assert on these timings.
"""

import argparse
import json
import multiprocessing
import os
import re
import resource
import tempfile
import time
from pathlib import Path

import torch


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", metavar="MODEL")
    parser.add_argument("--sentences", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runtime", default="auto", choices=("auto", "pytorch", "onnx", "onnx-int8"))
    parser.add_argument("--data", help="data folder (default: $BIODISTIL_DATA, else ../shared/data)")
    parser.add_argument("--no-memory", action="store_true", help="skip the child-process peak memory runs")
    parser.add_argument("--task", help="also compare on this task's test split (joined back into text): each model's "
                        "entities against what `evaluate --finetuned` scores, and every model's against the first's")
    return parser.parse_args()


def sentences(data: str | None, count: int) -> list[str]:
    """The first `count` sentences of corpus/biomed.txt."""
    from biodistil.data.paths import require_file, resolve_data_root

    found: list[str] = []
    with require_file(resolve_data_root(data), "corpus/biomed.txt").open(encoding="utf-8") as handle:
        for line in handle:
            found += [s for s in re.split(r"(?<=[.!?])\s+", line.strip()) if s]
            if len(found) >= count:
                return found[:count]
    return found


class ModelClock:
    """Seconds spent inside the model's calls."""

    def __init__(self) -> None:
        self.seconds, self._began = 0.0, 0.0

    def start(self) -> None:
        self._began = time.perf_counter()

    def stop(self) -> None:
        self.seconds += time.perf_counter() - self._began


class TimedModel:
    """An ONNX Runtime model whose calls `clock` times; everything else is the model's."""

    def __init__(self, model, clock: ModelClock):
        self._model, self._clock = model, clock

    def __call__(self, *args, **kwargs):
        self._clock.start()
        try:
            return self._model(*args, **kwargs)
        finally:
            self._clock.stop()

    def __getattr__(self, name: str):
        return getattr(self._model, name)


def run(model: str, runtime: str, texts: list[str], threads: int) -> dict:
    """Predict `texts` with `model` through the command's writer; wall time and the time inside the model."""
    from biodistil.export.predict import Document, Predictor, write_predictions

    torch.set_num_threads(threads)
    predictor = Predictor(model, runtime=runtime if not Path(model, "config.json").is_file() else "auto",
                          threads=threads)
    clock = ModelClock()
    if isinstance(predictor.model, torch.nn.Module):  # the time between its forward pre-hook and its forward hook
        predictor.model.register_forward_pre_hook(lambda *_: clock.start())
        predictor.model.register_forward_hook(lambda *_: clock.stop())
    else:
        predictor.model = TimedModel(predictor.model, clock)
    documents = [Document(str(i), text) for i, text in enumerate(texts)]
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        write_predictions(predictor, documents, str(Path(folder) / "out.jsonl"), progress=False)
        wall = time.perf_counter() - began
        entities = sum(len(json.loads(line).get("entities", [])) for line in (Path(folder) / "out.jsonl").open())
    return {"model": predictor.description, "records": len(texts), "seconds": round(wall, 2),
            "records_per_s": round(len(texts) / wall, 1), "model_seconds": round(clock.seconds, 2),
            "overhead_share": round(1 - clock.seconds / wall, 3), "entities": entities}


def _child(model: str, runtime: str, texts: list[str], threads: int, queue) -> None:
    run(model, runtime, texts, threads)
    queue.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)


def peak_mib(model: str, runtime: str, texts: list[str], threads: int) -> int:
    """Peak resident memory (MiB) of a fresh process that predicts `texts` with `model`."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_child, args=(model, runtime, texts, threads, queue))
    child.start()
    peak = queue.get()
    child.join()
    return int(peak)


def task_agreement(models: list[str], runtime: str, task_name: str, data: str | None) -> dict:
    """On a token task's test split: whether `predict` returns exactly the entities evaluation scores (per model),
    and the share of the first model's entities (start, end, label) each other model returns too."""
    from biodistil.export.deployed import expand_models, score_deployed
    from biodistil.export.predict import Predictor, entity_spans
    from biodistil.tasks.registry import get_task
    from biodistil.tasks.splits import read_split

    task = get_task(task_name)
    examples = read_split(task, "test", data)
    texts = [" ".join(example.tokens) for example in examples]
    found, same = [], {}
    for spec in models:
        path = spec.rpartition("=")[2]
        predictor = Predictor(path, runtime=runtime if not Path(path, "config.json").is_file() else "auto",
                              max_length=task.max_length)
        records = predictor(texts)
        variant = next(v for v in expand_models([(None, path)]) if v.path == predictor.variant.path)
        scored, _ = score_deployed(variant, task, examples)
        spans = [{(e["start"], e["end"], e["label"]) for e in record["entities"]} for record in records]
        evaluated = []
        for example, tags in zip(examples, scored.predictions.labels, strict=True):
            offsets = [len(" ".join(example.tokens[:i])) + (1 if i else 0) for i in range(len(example.tokens))]
            evaluated.append({(offsets[a], offsets[b] + len(example.tokens[b]), label)
                              for a, b, label in entity_spans(tags)})
        same[spec] = spans == evaluated
        found.append(spans)
    first = found[0]
    total = sum(len(s) for s in first)
    agreement = {spec: round(sum(len(a & b) for a, b in zip(first, other, strict=True)) / max(total, 1), 4)
                 for spec, other in zip(models, found, strict=True)}
    return {"task": task.name, "sentences": len(texts), "entities_of_first": total,
            "predict_equals_evaluate": same, "share_of_first_entities": agreement}


def main() -> None:
    args = parse()
    from biodistil.training.machine import cpu_line

    texts = sentences(args.data, args.sentences)
    rows = []
    for spec in args.models:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        row = {"name": name or Path(path).name, **run(path, args.runtime, texts, args.threads)}
        if not args.no_memory:
            row["peak_mib_half"] = peak_mib(path, args.runtime, texts[: len(texts) // 2], args.threads)
            row["peak_mib_all"] = peak_mib(path, args.runtime, texts, args.threads)
        rows.append(row)
    reference = rows[0]["records_per_s"]
    for row in rows:
        row["speedup"] = round(row["records_per_s"] / reference, 2)
    print(f"{len(texts):,} sentences of corpus/biomed.txt, {args.threads} thread(s); CPU: {cpu_line()}")
    for row in rows:
        memory = f"  peak {row['peak_mib_half']:,} / {row['peak_mib_all']:,} MiB (half / all)" \
            if "peak_mib_all" in row else ""
        print(f"  {row['name']:24s} {row['records_per_s']:9,.1f} records/s  {row['speedup']:5.2f}x  overhead "
              f"{100 * row['overhead_share']:4.1f}%  {row['entities']:,} entities{memory}  [{row['model']}]")
    result = {"sentences": len(texts), "threads": args.threads, "cpu": cpu_line(), "rows": rows,
              "load_1min": os.getloadavg()[0]}
    if args.task:
        result["task_check"] = task_agreement(args.models, args.runtime, args.task, args.data)
        check = result["task_check"]
        print(f"{check['task']} test ({check['sentences']:,} sentences): predict == evaluate "
              f"{check['predict_equals_evaluate']}; share of the first model's {check['entities_of_first']:,} "
              f"entities found: {check['share_of_first_entities']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
