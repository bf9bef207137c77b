"""A pipeline's `study` and `deploy` stages, through the seeds-scale study (recipes/studies/seeds-scale.yaml) run on a
slice: the tiny teacher in mpnet-base's place, a tiny 3-layer student in minilm-l6's, a tiny NER task."""

import json

import pytest
from kd_fixtures import OTHER, POSITIVE, save_student
from recipe_fixtures import RECIPES

from biodistil.data.synthetic import write_ner_task
from biodistil.pipeline import load_pipeline, run_pipeline

QUIET = {"progress_bar": False, "tensorboard": False}


def sliced(out, teacher_dir, small, task_file, corpus_file):
    recipe = load_pipeline(RECIPES / "studies" / "seeds-scale.yaml",
                           [f"vars.teacher={teacher_dir}", f"vars.small={small}", f"run.output_dir={out}"])
    distill, study, deploy = (stage.settings for stage in recipe.stages)
    distill["student"]["layers"], distill["data"]["train"] = [0, 2], [str(corpus_file)]
    distill["data"]["block_size"] = 32
    distill["train"].update(max_steps=2, batch_size=4, eval_every=0, save_every=0, **QUIET)
    study.update(seeds=[1], student_layers=[0, 2])
    study["tasks"][0].update(name=str(task_file))
    study["tasks"][0]["teacher_overrides"]["train"].update(batch_size=8, **QUIET)
    for command in ("finetune", "kd"):
        study["defaults"][command]["task"]["max_length"] = 32
        study["defaults"][command]["train"] = {**study["defaults"][command]["train"], "batch_size": 8,
                                               "eval_every": 0}
    # the 6 x 768 arms' code paths are the 3 x 384 ones' (and the distilled arm's finetune): two arms less to run
    study["arms"] = [arm for arm in study["arms"] if arm["name"] not in ("ft-6x768", "kd-6x768")]
    for arm in study["arms"]:
        for section in ("model", "student"):
            if section in arm.get("overrides", {}) and "layers" in arm["overrides"][section]:
                arm["overrides"][section]["layers"] = [0, 2]
    deploy["task"] = str(task_file)
    deploy["models"] = [{**model, "path": model["path"].replace("ncbi_disease", "tiny_ner"),
                         "export": model["name"] == "kd-3x384"}
                        for model in deploy["models"] if model["name"] in ("teacher", "kd-3x384")]
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
    assert [stage["name"] for stage in record["stages"]] == ["distilled", "study", "deploy"]
    summary = record["stages"][1]["summary"]
    assert [row["arm"] for row in summary["rows"]] == ["ft-6x768-distilled", "ft-3x384", "kd-3x384"]
    config = (out / "study" / "tiny_ner" / "ft-6x768-distilled" / "seed-1" / "config.yaml").read_text()
    assert str(out / "distilled" / "model") in config, "the arm fine-tunes the distilled stage's student"
    deployed = record["stages"][2]["deploy"]
    assert set(deployed["exports"]) == {"kd-3x384"} and deployed["exports"]["kd-3x384"]["accuracy"]
    timed = {row["label"] for row in deployed["bench"]["models"]}
    assert timed == {"teacher", "kd-3x384", "kd-3x384-onnx-int8"}, "PyTorch and int8 timed; the fp32 graph is not"
    scored = {cell["model"] for cell in deployed["results"]["cells"]}
    assert scored == timed | {"kd-3x384-onnx"}, "every model and graph is scored on the test split"
    exported = (out / "deploy" / "onnx" / "kd-3x384" / "export.json").stat().st_mtime_ns
    scored = (out / "deploy" / "scored" / "results.json").stat().st_mtime_ns
    run_pipeline(sliced(out, teacher_dir, small, task_file, corpus_file))
    assert (out / "deploy" / "onnx" / "kd-3x384" / "export.json").stat().st_mtime_ns == exported, "exports are kept"
    assert (out / "deploy" / "scored" / "results.json").stat().st_mtime_ns == scored, "so are the scores"
