"""What a second teacher costs in task KD (issue 37): the time of a student step with one teacher against two, cached
and live, in one process, on the same batches.

    python bench/research/kd_teachers.py --threads 2 --steps 20

Teachers: `minilm-l6` with two fresh token-classification heads (seeds 1 and 2: the same architecture, two different
teachers); student: its layers 0, 2, 4 with a fresh head; NCBI-disease training sentences (the data folder's), batch
32, max length 128, Hinton KD at T = 2 (mixture of the two teachers). Modes, alternated step by step so that load
drifts hit each alike:

- cached-1 / cached-2: each teacher's outputs computed once into its own store entry; a step reads their rows;
- live-1 / live-2: the teachers run on every batch (under no_grad, one after another);
- forward-1, forward-2: one teacher's forward pass alone (so live-2 can be compared with the sum of the forwards).

Prints the median step time per mode, the ratios cached-2 / cached-1 (target ≤ 1.1) and live-2 / (student step +
forward-1 + forward-2) (target ≤ 1.15), the CPU's flags, and one JSON line last. Tests never assert on timings.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode (after 3 untimed)")
    parser.add_argument("--sentences", type=int, default=640)
    parser.add_argument("--data", help="data folder (default: $BIODISTIL_DATA, else ../shared/data)")
    return parser.parse_args()


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    from biodistil.config import TrainConfig
    from biodistil.data.paths import resolve_data_root
    from biodistil.embedded import resolve_model_name
    from biodistil.finetune.init_model import init_model_path
    from biodistil.kd.module import KDModule, kd_data
    from biodistil.kd.recipe import KDOptions
    from biodistil.kd.transfer import unlabelled
    from biodistil.models.loading import load_tokenizer
    from biodistil.tasks.classifier import build_classifier
    from biodistil.tasks.recipe import TaskConfig, task_spec
    from biodistil.teachers.signal import CachedTeacher, OnlineTeacher, classifier_forward
    from biodistil.teachers.task_cache import TeacherRequest, cached_teacher_outputs
    from biodistil.training.engine import adamw
    from biodistil.training.machine import cpu_line

    task = task_spec(TaskConfig(name="ncbi_disease", max_length=128))
    examples = [unlabelled(e) for e in task.load_split("train", resolve_data_root(args.data))[: args.sentences]]
    root = Path(tempfile.mkdtemp(prefix="kd-teachers-"))
    base = resolve_model_name("minilm-l6")
    teachers = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = build_classifier(base, task)
        model.save_pretrained(root / f"teacher-{seed}")
        load_tokenizer(base).save_pretrained(root / f"teacher-{seed}")
        teachers.append(root / f"teacher-{seed}")
    student_path = init_model_path(base, [0, 2, 4], root)
    tokenizer = load_tokenizer(student_path)
    cached = [CachedTeacher(cached_teacher_outputs(str(path), examples, TeacherRequest(task), root / "cache"),
                            slot=slot) for slot, path in enumerate(teachers)]
    models = [build_classifier(str(path), task).eval() for path in teachers]
    live = [OnlineTeacher(model, classifier_forward, slot) for slot, model in enumerate(models)]
    signals = {"cached-1": cached[:1], "cached-2": cached, "live-1": live[:1], "live-2": live}
    runs = {}
    for mode, chosen in signals.items():
        torch.manual_seed(0)
        student = build_classifier(student_path, task)
        module = KDModule(student, task, KDOptions(temperature=2.0), chosen,
                          teacher_weights=[1 / len(chosen)] * len(chosen))
        features, collate = kd_data(task, examples, tokenizer, chosen)
        batches = [collate(features[i:i + 32]) for i in range(0, len(features) - 31, 32)]
        runs[mode] = (module, adamw(module, TrainConfig(learning_rate=1e-4)), batches)  # the engine's optimizer
    times: dict[str, list[float]] = {mode: [] for mode in [*signals, "forward-1", "forward-2"]}
    for step in range(args.steps + 3):
        for mode, (module, optimizer, batches) in runs.items():
            batch = batches[step % len(batches)]
            started = time.perf_counter()
            loss, _ = module(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step >= 3:
                times[mode].append(time.perf_counter() - started)
        batch = runs["live-1"][2][step % len(runs["live-1"][2])]
        for k, signal in enumerate(live):
            started = time.perf_counter()
            signal.get_signal(batch, runs["live-1"][0].teacher_request)
            if step >= 3:
                times[f"forward-{k + 1}"].append(time.perf_counter() - started)
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    student_step = medians["live-1"] - medians["forward-1"]
    ratios = {"cached-2 / cached-1": medians["cached-2"] / medians["cached-1"],
              "live-2 / (student step + forward-1 + forward-2)":
                  medians["live-2"] / (student_step + medians["forward-1"] + medians["forward-2"])}
    print(f"CPU: {cpu_line()}; {args.threads} threads; {args.steps} steps per mode, batch 32, NCBI-disease")
    for mode, value in medians.items():
        print(f"  {mode:10s} {1000 * value:8.1f} ms")
    for name, value in ratios.items():
        print(f"  {name}: {value:.3f}")
    print(json.dumps({"threads": args.threads, "steps": args.steps, "cpu": cpu_line(),
                      "median_ms": {k: round(1000 * v, 2) for k, v in medians.items()},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()}}))


if __name__ == "__main__":
    main()
