"""Speed and memory of `biodistil predict` (the `Predictor` code path) on real sentences, teacher against student.

    python bench/predict.py runs/demo/study/ncbi_disease/teacher/model runs/demo/student-onnx --threads 1

Reads the first `--sentences` sentences of corpus/biomed.txt (the data folder's; lines split at sentence ends) and
runs each MODEL on them through `write_predictions` (the command's writer, output to a temporary file), one model at
a time in this process, in the order given, the first being the reference (`--rounds N`: N times round robin, each
model's fastest round kept). Per model: records/s, its ratio to the reference, the share of the wall time spent
outside the model's forward calls (tokenising, windowing, word and character offsets, JSON writing: the `predict`
overhead), and peak memory (ru_maxrss of a fresh child process that predicts half the sentences, then of one that
predicts all of them: a peak that does not grow with the input's size is the same twice). MODEL: a model folder
(PyTorch fp32), an export folder (`--runtime`, default auto: its int8 graph) or NAME=PATH; `@RUNTIME` after it runs
that one with `predict --runtime RUNTIME` (e.g. `student=MODEL@pytorch-bf16`: a model folder under bf16 autocast).
`--int8-fallback MARGIN...` adds, after each int8 model, a row per margin with `predict --int8-fallback` (the
windows int8 is unsure of predicted again by the fp32 graph; the share of windows it reran). Prints a table and,
last, one JSON line. Tests never assert on these timings.

    python bench/predict.py teacher=TEACHER student=EXPORT --int8-fallback 0.1 --task ncbi_disease --split dev
    python bench/predict.py teacher=TEACHER student=STUDENT student-bf16=STUDENT@pytorch-bf16 --task ncbi_disease
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
    parser.add_argument("--rounds", type=int, default=1, help="run the models round robin this many times and keep "
                        "each one's fastest round (a machine whose speed moves between minutes moves every model; "
                        "each round's ratios are printed too)")
    parser.add_argument("--runtime", default="auto", choices=("auto", "pytorch", "onnx", "onnx-int8"),
                        help="for export folders without @RUNTIME (model folders run in PyTorch float32)")
    parser.add_argument("--data", help="data folder (default: $BIODISTIL_DATA, else ../shared/data)")
    parser.add_argument("--no-memory", action="store_true", help="skip the child-process peak memory runs")
    parser.add_argument("--task", help="also compare on this task's split (joined back into text): each model's "
                        "entities against what `evaluate --finetuned` scores, and every model's against the first's")
    parser.add_argument("--split", default="test", help="the --task split (test; dev to choose a fallback margin)")
    parser.add_argument("--int8-fallback", type=float, nargs="+", default=[], metavar="MARGIN",
                        help="also run each int8 model with `predict --int8-fallback MARGIN`, for each margin")
    return parser.parse_args()


Row = tuple[str, str, str, float | None]  # name, path, runtime, fallback margin


def variants(specs: list[str], runtime: str, margins: list[float]) -> list[Row]:
    """A row per MODEL, then one per fallback margin after each that runs int8."""
    from biodistil.export.predict import RUNTIMES, choose_variant

    rows = []
    for spec in specs:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        before, _, after = path.rpartition("@")
        path, asked = (before, after) if before and after in RUNTIMES else (path, "")
        name, chosen = name or Path(path).name, asked or runtime_of(path, runtime)
        rows.append((name, path, chosen, None))
        if margins and choose_variant(path, chosen).precision == "int8":
            rows += [(f"{name}+fp32<{margin:g}", path, chosen, margin) for margin in margins]
    return rows


def runtime_of(path: str, runtime: str) -> str:
    """A model folder runs in PyTorch float32 (auto) whatever `--runtime` says; an export folder as `--runtime` says."""
    return runtime if not Path(path, "config.json").is_file() else "auto"


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
    """Seconds spent inside the model's calls (`start` and `stop` are also a PyTorch module's forward hooks)."""

    def __init__(self) -> None:
        self.seconds, self._began = 0.0, 0.0

    def start(self, *_) -> None:
        self._began = time.perf_counter()

    def stop(self, *_) -> None:
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


def run(model: str, runtime: str, texts: list[str], threads: int, fallback: float | None = None) -> dict:
    """Predict `texts` with `model` through the command's writer; wall time and the time inside the model."""
    from biodistil.export.predict import Document, Predictor, write_predictions

    torch.set_num_threads(threads)
    predictor = Predictor(model, runtime=runtime, threads=threads, int8_fallback=fallback)
    clock = ModelClock()
    if isinstance(predictor.model, torch.nn.Module):
        predictor.model.register_forward_pre_hook(clock.start)
        predictor.model.register_forward_hook(clock.stop)
    else:
        predictor.model = TimedModel(predictor.model, clock)
    if predictor.fallback is not None:
        predictor.fallback.model = TimedModel(predictor.fallback.model, clock)
    documents = [Document(str(i), text) for i, text in enumerate(texts)]
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        write_predictions(predictor, documents, str(Path(folder) / "out.jsonl"), progress=False)
        wall = time.perf_counter() - began
        entities = sum(len(json.loads(line).get("entities", [])) for line in (Path(folder) / "out.jsonl").open())
    row = {"model": predictor.description, "records": len(texts), "seconds": round(wall, 2),
           "records_per_s": round(len(texts) / wall, 1), "model_seconds": round(clock.seconds, 2),
           "overhead_share": round(1 - clock.seconds / wall, 3), "entities": entities}
    if predictor.fallback is not None:
        row["fallback_rerun_share"] = round(predictor.fallback.rerun / max(predictor.fallback.windows, 1), 4)
    return row


def _child(model: str, runtime: str, texts: list[str], threads: int, fallback: float | None, queue) -> None:
    run(model, runtime, texts, threads, fallback)
    queue.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)


def peak_mib(model: str, runtime: str, texts: list[str], threads: int, fallback: float | None = None) -> int:
    """Peak resident memory (MiB) of a fresh process that predicts `texts` with `model`."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_child, args=(model, runtime, texts, threads, fallback, queue))
    child.start()
    peak = queue.get()
    child.join()
    return int(peak)


def task_agreement(rows: list[Row], task_name: str, data: str | None, split: str = "test") -> dict:
    """On a token task's split: whether `predict` returns exactly the entities evaluation scores (per model; a
    fallback or bf16 row has no evaluation to equal), and the share of the first model's entities (start, end,
    label) each other row returns too. ONNX Runtime runs at 1 thread here: with several, its sums may come in another
    order from one session to the next, and a near-tied tag could then differ between `predict` and evaluation."""
    from biodistil.export.deployed import expand_models, score_deployed
    from biodistil.export.predict import Predictor, entity_spans
    from biodistil.tasks.registry import get_task
    from biodistil.tasks.splits import read_split

    task = get_task(task_name)
    examples = read_split(task, split, data)
    texts = [" ".join(example.tokens) for example in examples]
    found, same, rerun = [], {}, {}
    for name, path, runtime, fallback in rows:
        predictor = Predictor(path, runtime=runtime, threads=1, max_length=task.max_length, int8_fallback=fallback)
        records = predictor(texts)
        spans = [{(e["start"], e["end"], e["label"]) for e in record["entities"]} for record in records]
        found.append(spans)
        if predictor.fallback is not None:
            rerun[name] = round(predictor.fallback.rerun / max(predictor.fallback.windows, 1), 4)
        if predictor.fallback is not None or predictor.autocast is not None:
            continue
        variant = next(v for v in expand_models([(None, path)]) if v.path == predictor.variant.path)
        scored, _ = score_deployed(variant, task, examples, threads=1)
        evaluated = []
        for example, tags in zip(examples, scored.predictions.labels, strict=True):
            offsets = [len(" ".join(example.tokens[:i])) + (1 if i else 0) for i in range(len(example.tokens))]
            evaluated.append({(offsets[a], offsets[b] + len(example.tokens[b]), label)
                              for a, b, label in entity_spans(tags)})
        same[name] = spans == evaluated
    first = found[0]
    total = sum(len(s) for s in first)
    agreement = {name: round(sum(len(a & b) for a, b in zip(first, other, strict=True)) / max(total, 1), 4)
                 for (name, *_), other in zip(rows, found, strict=True)}
    return {"task": task.name, "split": split, "sentences": len(texts), "entities_of_first": total,
            "predict_equals_evaluate": same, "share_of_first_entities": agreement, "fallback_rerun_share": rerun}


def main() -> None:
    args = parse()
    from biodistil.training.machine import cpu_line

    texts = sentences(args.data, args.sentences)
    planned = variants(args.models, args.runtime, args.int8_fallback)
    rounds = [[{"name": name, **run(path, runtime, texts, args.threads, fallback)}
               for name, path, runtime, fallback in planned] for _ in range(args.rounds)]
    rows = [max(runs, key=lambda row: row["records_per_s"]) for runs in zip(*rounds, strict=True)]
    references = [runs[0] for runs in rounds]  # each round's ratios are to its own first model
    for row, runs in zip(rows, zip(*rounds, strict=True), strict=True):
        row["speedup"] = round(row["records_per_s"] / rows[0]["records_per_s"], 2)
        if args.rounds > 1:
            row["speedup_per_round"] = [round(mine["records_per_s"] / first["records_per_s"], 2)
                                        for mine, first in zip(runs, references, strict=True)]
    if not args.no_memory:
        for row, (_, path, runtime, fallback) in zip(rows, planned, strict=True):
            row["peak_mib_half"] = peak_mib(path, runtime, texts[: len(texts) // 2], args.threads, fallback)
            row["peak_mib_all"] = peak_mib(path, runtime, texts, args.threads, fallback)
    print(f"{len(texts):,} sentences of corpus/biomed.txt, {args.threads} thread(s), fastest of {args.rounds} "
          f"round(s); CPU: {cpu_line()}")
    for row in rows:
        memory = f"  peak {row['peak_mib_half']:,} / {row['peak_mib_all']:,} MiB (half / all)" \
            if "peak_mib_all" in row else ""
        per_round = f" (rounds: {', '.join(f'{r:.2f}x' for r in row['speedup_per_round'])})" \
            if "speedup_per_round" in row else ""
        print(f"  {row['name']:24s} {row['records_per_s']:9,.1f} records/s  {row['speedup']:5.2f}x{per_round}  "
              f"overhead {100 * row['overhead_share']:4.1f}%  {row['entities']:,} entities{memory}  [{row['model']}]")
    result = {"sentences": len(texts), "threads": args.threads, "cpu": cpu_line(), "rows": rows,
              "load_1min": os.getloadavg()[0]}
    if args.task:
        result["task_check"] = task_agreement(planned, args.task, args.data, args.split)
        check = result["task_check"]
        print(f"{check['task']} {check['split']} ({check['sentences']:,} sentences): predict == evaluate "
              f"{check['predict_equals_evaluate']}; share of the first model's {check['entities_of_first']:,} "
              f"entities found: {check['share_of_first_entities']}; windows the fallback reran: "
              f"{check['fallback_rerun_share']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
