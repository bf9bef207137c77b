"""A pipeline's `study` and `deploy` stages, through Study 6 at its claims' strength
(recipes/studies/seeds-scale-converged.yaml) run on a slice: the tiny teacher in mpnet-base's place, a tiny 3-layer
student in minilm-l6's, a tiny NER task; three distillation seeds, two teacher seeds, an arm with three starts."""

import json

import pytest
from kd_fixtures import OTHER, POSITIVE, save_student
from recipe_fixtures import RECIPES
from test_studies import results_tables

from biodistil.data.synthetic import write_ner_task
from biodistil.pipeline import load_pipeline, run_pipeline

QUIET = {"progress_bar": False, "tensorboard": False}


def sliced(out, teacher_dir, small, task_file, corpus_file):
    recipe = load_pipeline(RECIPES / "studies" / "seeds-scale-converged.yaml",
                           [f"vars.teacher={teacher_dir}", f"vars.small={small}", f"run.output_dir={out}"])
    *_, study, deploy = (stage.settings for stage in recipe.stages)
    distill = recipe.stages[0].settings  # the three distillation stages share these settings (one YAML anchor)
    distill["student"]["layers"], distill["data"]["train"] = [0, 2], [str(corpus_file)]
    distill["data"]["block_size"] = 32
    distill["train"].update(max_steps=2, batch_size=4, eval_every=0, save_every=0, **QUIET)
    study.update(seeds=[1], student_layers=[0, 2], resamples=200)
    study["tasks"][0].update(name=str(task_file))
    for command in ("finetune", "kd"):
        study["defaults"][command]["task"]["max_length"] = 32
        study["defaults"][command]["train"] = {**study["defaults"][command]["train"], "batch_size": 8,
                                               "eval_every": 0}
        study["defaults"][command][command]["epochs"] = 1
    next(arm for arm in study["arms"] if arm.get("starts"))["seeds"] = [1, 2]  # two levels: starts × seeds (crossed)
    # the 6 x 768 arms' code paths are the 3 x 384 ones' (and the distilled arm's finetune): two arms less to run
    study["arms"] = [arm for arm in study["arms"] if arm["name"] not in ("ft-6x768", "kd-6x768")]
    for arm in study["arms"]:
        for section in ("model", "student"):
            if section in arm.get("overrides", {}) and "layers" in arm["overrides"][section]:
                arm["overrides"][section]["layers"] = [0, 2]
    deploy["task"] = str(task_file)
    deploy["models"] = [{**model, "path": model["path"].replace("ncbi_disease", "tiny_ner"),
                         "export": model["name"] == "kd-3x384-s1"}
                        for model in deploy["models"] if model["name"] in ("teacher", "teacher-seed-2", "kd-3x384-s1")]
    deploy["bench"] = {"lengths": [16], "warmup": 0, "repeats": 1, "threads": 1, "memory": "off"}
    return recipe


@pytest.mark.slow
def test_the_seeds_scale_pipeline_runs_its_study_and_deploy_stages_on_a_slice(
        tmp_path, teacher_dir, tokenizer, corpus_file):
    task_file = write_ner_task(tmp_path / "task", "tiny_ner", POSITIVE, OTHER, {"train": 24, "dev": 12, "test": 12})
    small = save_student(tokenizer, tmp_path / "small", layers=3)
    out = tmp_path / "run"
    run_pipeline(sliced(out, teacher_dir, small, task_file, corpus_file))
    record = json.loads((out / "pipeline.json").read_text())
    assert [stage["name"] for stage in record["stages"]] == ["distilled-1", "distilled-2", "distilled-3", "study",
                                                              "deploy"]
    summary = record["stages"][3]["summary"]
    assert [row["arm"] for row in summary["rows"]] == ["ft-6x768-distilled", "ft-3x384", "kd-3x384"]
    for start in (1, 2, 3):
        config = (out / "study" / "tiny_ner" / "ft-6x768-distilled" / f"start-{start}" / "seed-1" / "config.yaml")
        assert str(out / f"distilled-{start}" / "model") in config.read_text(), "each start is its distillation seed's"
    distilled = summary["rows"][0]
    assert distilled["starts"] == 3 and distilled["seeds"] == 6 and len(distilled["start_scores"]) == 3
    runs = {(run["start"], run["seed"]): run["test"]["f1"] for run in summary["runs"] if run["arm"] == distilled["arm"]}
    assert distilled["start_seed_scores"] == [[runs[start, seed] for seed in (1, 2)] for start in (1, 2, 3)], \
        "the grid its t-test takes: starts × the same seeds, crossed"
    assert distilled["share"]["groups"] == [3, 2] and distilled["share"]["runs"] == [6, 2]
    assert all("estimate" in row["share_dev"] for row in summary["rows"]), \
        "the share on dev beside test, from the finetune and kd runs' dev predictions"
    teacher = summary["teachers"]["tiny_ner"]
    seeds = [teacher["teacher_seeds"][seed]["test"]["f1"] for seed in ("1", "2")]
    assert teacher["test"]["f1"] == pytest.approx(sum(seeds) / 2) and distilled["teacher"] == teacher["test"]["f1"]
    deployed = record["stages"][4]["deploy"]
    assert set(deployed["exports"]) == {"kd-3x384-s1"} and deployed["exports"]["kd-3x384-s1"]["accuracy"]
    timed = {row["label"] for row in deployed["bench"]["models"]}
    assert timed == {"teacher", "kd-3x384-s1", "kd-3x384-s1-onnx-int8"}, \
        "PyTorch and int8 timed; the fp32 graph and the second teacher seed (time: false) are not"
    scored = {cell["model"] for cell in deployed["results"]["cells"]}
    assert scored == timed | {"kd-3x384-s1-onnx", "teacher-seed-2"}, "every model and graph is scored"
    differences = {(d["model"], d["reference"]): d for d in deployed["results"]["differences"]}
    assert set(differences) == {(model, "teacher") for model in scored - {"teacher"}} | {
        ("kd-3x384-s1-onnx", "kd-3x384-s1"), ("kd-3x384-s1-onnx-int8", "kd-3x384-s1")}, \
        "each model against the first (the teacher), and each graph against the model it was exported from"
    cells = {cell["model"]: cell["score"] for cell in deployed["results"]["cells"]}
    int8 = differences["kd-3x384-s1-onnx-int8", "kd-3x384-s1"]
    assert int8["estimate"] == pytest.approx(cells["kd-3x384-s1-onnx-int8"] - cells["kd-3x384-s1"], abs=1e-12)
    assert int8["low"] <= int8["estimate"] <= int8["high"] and int8["examples"] == 12
    assert set(deployed["seconds"]) == {"export kd-3x384-s1", "scoring"} and all(
        seconds > 0 for seconds in deployed["seconds"].values()), "the stage's time, part by part, in its record"
    _the_results_page_reads_the_record(record, cells, int8)
    exported = (out / "deploy" / "onnx" / "kd-3x384-s1" / "export.json").stat().st_mtime_ns
    scored = (out / "deploy" / "scored" / "results.json").stat().st_mtime_ns
    run_pipeline(sliced(out, teacher_dir, small, task_file, corpus_file))
    assert (out / "deploy" / "onnx" / "kd-3x384-s1" / "export.json").stat().st_mtime_ns == exported, \
        "exports are kept"
    assert (out / "deploy" / "scored" / "results.json").stat().st_mtime_ns == scored, "so are the scores"
    again = json.loads((out / "pipeline.json").read_text())["stages"][4]["deploy"]
    assert again["seconds"] == deployed["seconds"], "and the seconds they took"


def _the_results_page_reads_the_record(record, cells, int8):
    """docs/results/tables.py's Study 6 functions on this record's shape (the record that replaces seeds-scale.json)."""
    tables = results_tables()
    text = tables.seeds_scale_converged_tables(record)
    assert (f"| kd-3x384-s1 | {100 * cells['kd-3x384-s1']:.1f} | {100 * cells['kd-3x384-s1-onnx-int8']:.1f} | "
            f"{100 * int8['estimate']:+.2f} | {100 * int8['low']:+.2f} to {100 * int8['high']:+.2f} |") in text
    distilled = next(line for line in text.splitlines() if line.startswith("| ft-6x768-distilled | ") and ";" in line)
    assert distilled.count(";") == 2, "the run-by-run row: three distillation runs, their fine-tuning seeds within"
    assert "| kd-3x384 − ft-3x384 |" in text and "3 runs" in text
    figures = tables.seeds_scale_converged_figures(record)
    share = next(row for row in record["stages"][3]["summary"]["rows"] if row["arm"] == "ft-6x768-distilled")["share"]
    assert figures["target-98"] == ("reached" if share["low"] >= 0.98 else
                                    "not reached" if share["high"] < 0.98 else "not settled")
    assert figures["int8:kd-3x384-s1"] == tables.signed(int8["estimate"], 2, 100)
    assert figures["int8-speed:kd-3x384-s1"] and figures["distilled-runs"] == "3"
    seconds = [sum(record["stages"][4]["deploy"]["seconds"].values()),
               record["stages"][3]["summary"]["wall_seconds"],
               *(tables.training_seconds(stage) for stage in record["stages"][:3])]
    assert tables._study_pipeline_minutes(record) == pytest.approx(sum(seconds) / 60), "the deploy stage counted"
