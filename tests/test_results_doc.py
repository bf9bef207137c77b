"""docs/results.md is backed by the committed study records: its tables are the ones docs/results/tables.py prints
from docs/results/*.json, and each record was produced by the study recipe committed under recipes/studies/."""

import json
import re
import subprocess

import pytest
from recipe_fixtures import RECIPES
from test_studies import results_tables

from biodistil.config import load_recipe, validate_recipe
from biodistil.embedded import model_name_of
from biodistil.kd.recipe import StudyRecipe
from biodistil.pipeline import PipelineRecipe

DOCS = RECIPES.parent / "docs"
STUDY_RECIPES = {"task-agnostic": "task-agnostic-seeds.yaml", "transfer-data": "transfer-data.yaml",
                 "meta-kd": "meta-kd.yaml", "cross-tokenizer": "cross-tokenizer.yaml",
                 "users-setting": "users-setting-converged.yaml", "multi-teacher": "multi-teacher-converged.yaml",
                 "seeds-scale": "seeds-scale.yaml", "vekd": "vekd.yaml"}
RUN_SPECIFIC = {"run", "data_dir"}  # output folder, data folder


def portable(settings: object) -> object:
    """A recorded recipe with each model folder the run resolved (on its machine) as the model's short name."""
    if isinstance(settings, dict):
        return {key: portable(value) for key, value in settings.items()}
    if isinstance(settings, list):
        return [portable(value) for value in settings]
    return model_name_of(settings) if isinstance(settings, str) else settings


@pytest.mark.parametrize("name", [*sorted(STUDY_RECIPES), "demo", "precision"])
def test_the_results_page_shows_the_tables_of_the_committed_record(name):
    tables = results_tables()
    assert (DOCS / "results" / f"{name}.json").is_file(), f"docs/results/{name}.json is missing"
    assert tables.block(name) in tables.page(name).read_text(encoding="utf-8"), (
        f"the {name} tables of {tables.page(name).name} differ from the record; run python docs/results/tables.py "
        "--write")


@pytest.mark.parametrize("name", ["transfer-data", "meta-kd", "users-setting", "multi-teacher"])
def test_each_study_record_was_produced_by_the_committed_recipe(name):
    """Compared by model names, without loading a model: a fetched one (mpnet-base) need not be on this machine."""
    record = json.loads((DOCS / "results" / f"{name}.json").read_text())
    recipe = load_recipe(StudyRecipe, RECIPES / "studies" / STUDY_RECIPES[name], resolve_models=False).model_dump(
        mode="json")
    # the record read as today's recipe reads it: fields added since take their defaults on both sides
    settings = {**portable(record["settings"]), **{k: recipe[k] for k in RUN_SPECIFIC}}
    ran = validate_recipe(StudyRecipe, settings, resolve_models=False).model_dump(mode="json")
    assert {k: v for k, v in ran.items() if k not in RUN_SPECIFIC} == {
        k: v for k, v in recipe.items() if k not in RUN_SPECIFIC}
    seeds = {arm["name"]: len(arm.get("seeds") or record["seeds"]) for arm in record["settings"]["arms"]}
    assert len(record["seeds"]) >= 3 and all(row["seeds"] == seeds[row["arm"]] for row in record["rows"])
    if name in ("users-setting", "multi-teacher"):  # converged teachers (issue 56): CPU hours; wall time stated
        assert record["wall_seconds"] > 0 and record["machines"], "the record says how long and where"
    else:
        assert record["wall_seconds"] < 60 * 60, "the study finishes within 60 minutes"


def test_the_cross_tokenizer_record_was_produced_by_the_committed_pipeline():
    record = json.loads((DOCS / "results" / "cross-tokenizer.json").read_text())
    recipe = load_recipe(PipelineRecipe, RECIPES / "studies" / STUDY_RECIPES["cross-tokenizer"]).model_dump(mode="json")
    assert record["recipe"]["stages"] == recipe["stages"]
    results = record["stages"][-1]["results"]
    assert results["complete"] and len(results["seeds"]) >= 2 and len(results["tasks"]) >= 1
    spent = sum(stage["summary"]["result"]["seconds"] for stage in record["stages"][:-1]) / 60
    spent += sum(cell["wall_seconds"] for cell in results["cells"]) / 60
    assert spent < 30, "the study finishes within 30 minutes"


def test_the_task_agnostic_record_repeats_every_distillation_and_trains_its_teacher_longest():
    """Study 1's record (issue 56): the committed pipeline's stages; distilbert and tinybert over 3 distillation runs
    each fine-tuned with 3 seeds, layers-only and random-init with 3 seeds; the teacher's 3 seeds, each at least as
    many steps as any student and dev-selected; every run in float32."""
    record = json.loads((DOCS / "results" / "task-agnostic.json").read_text())
    recipe = load_recipe(PipelineRecipe, RECIPES / "studies" / STUDY_RECIPES["task-agnostic"]).model_dump(mode="json")
    assert record["recipe"]["stages"] == recipe["stages"]
    summary = {stage["name"]: stage for stage in record["stages"]}["study"]["summary"]
    rows = {row["arm"]: row for row in summary["rows"]}
    assert set(rows) == {"distilbert", "tinybert", "layers-only", "random-init"}
    for arm in ("distilbert", "tinybert"):
        assert rows[arm]["starts"] == 3 and len(rows[arm]["start_scores"]) == 3 and rows[arm]["seeds"] == 9
    assert rows["layers-only"]["seeds"] == rows["random-init"]["seeds"] == 3
    (teacher,) = summary["teachers"].values()
    assert len(teacher["teacher_seeds"]) == 3
    assert teacher["steps"] >= max(run["steps"] for run in summary["runs"])
    assert all(seed["best_step"] <= teacher["steps"] for seed in teacher["teacher_seeds"].values())
    stages = [stage for stage in record["stages"] if stage["command"] == "distill"]
    assert len(stages) == 6 and all(stage["summary"]["result"]["precision"].startswith("float32") for stage in stages)
    assert summary["settings"]["defaults"]["finetune"]["train"]["precision"] == "no", "fine-tuning in float32"


def holds(resolved: object, written: object) -> bool:
    """Whether every setting `written` (a recipe's YAML) has its value in `resolved` (the settings a run recorded)."""
    if isinstance(written, dict):
        return isinstance(resolved, dict) and all(key in resolved and holds(resolved[key], value)
                                                  for key, value in written.items())
    return resolved == written


def test_the_seeds_scale_record_was_produced_by_the_committed_pipeline():
    record = json.loads((DOCS / "results" / "seeds-scale.json").read_text())
    recipe = load_recipe(PipelineRecipe, RECIPES / "studies" / "seeds-scale.yaml").model_dump(mode="json")
    assert record["recipe"]["stages"] == recipe["stages"]
    stages = {stage["name"]: stage for stage in record["stages"]}
    summary = stages["study"]["summary"]
    arms = [arm["name"] for arm in recipe["stages"][1]["settings"]["arms"]]
    assert [row["arm"] for row in summary["rows"]] == arms and all(row["seeds"] >= 3 for row in summary["rows"])
    assert holds(summary["settings"]["defaults"], recipe["stages"][1]["settings"]["defaults"]), \
        "the study ran with the committed recipe's settings"
    deployed = stages["deploy"]["deploy"]
    assert set(deployed["exports"]) == {"teacher", *arms}
    assert {row["label"] for row in deployed["bench"]["models"]} >= {f"{arm}-onnx-int8" for arm in arms}
    minutes = (stages["distilled"]["summary"]["result"]["seconds"] + summary["wall_seconds"]) / 60
    assert minutes < 90, "distillation and the study leave the deploy stage its share of the 2 hours"


def test_study_1s_crossed_test_lowers_no_p_of_the_recipes_test_and_removes_one_finding():
    """What the page's introduction says of Study 1's change of analysis, checked on its record: the crossed variance
    of runs × seeds against the test on the distillation runs' means the recipe named."""
    tables = results_tables()
    summary = {stage["name"]: stage for stage in tables.load("task-agnostic")["stages"]}["study"]["summary"]
    crossed = tables.task_agnostic_seeds_family(summary)
    means = tables.task_agnostic_seeds_family(summary, tables._runs_means)
    assert all(crossed[pair].p_value >= means[pair].p_value - 1e-12 and
               crossed[pair].p_holm >= means[pair].p_holm - 1e-12 for pair in crossed)
    removed = [pair for pair in crossed if means[pair].finding and not crossed[pair].finding]
    assert removed == [("distilbert", "tinybert")]
    assert not [pair for pair in crossed if crossed[pair].finding and not means[pair].finding]


def test_the_vekd_record_was_produced_by_the_committed_pipeline():
    """Study 7's record: the committed pipeline's stages, every arm on both tasks over its 3 distillation runs with no
    one-class run, the task teachers with 2 seeds, the study's defaults those of the recipe."""
    record = json.loads((DOCS / "results" / "vekd.json").read_text())
    recipe = load_recipe(PipelineRecipe, RECIPES / "studies" / "vekd.yaml").model_dump(mode="json")
    assert record["recipe"]["stages"] == recipe["stages"]
    summary = {stage["name"]: stage for stage in record["stages"]}["study"]["summary"]
    assert {(row["task"], row["arm"]) for row in summary["rows"]} == {
        (task, arm) for task in ("ncbi_disease", "bc5cdr_disease") for arm in ("ft-vekd", "ft-adapt-distill", "ft-kd")}
    assert all(row["starts"] == 3 and len(row["start_scores"]) == 3 and not row["degenerate_seeds"]
               for row in summary["rows"])
    assert all(len(teacher["teacher_seeds"]) == 2 for teacher in summary["teachers"].values())
    assert holds(summary["settings"]["defaults"], recipe["stages"][-1]["settings"]["defaults"])


def test_gap_cells_say_when_a_seed_has_no_gap_to_close():
    tables = results_tables()
    assert tables.gap_cell([0.5, 0.7]) == "60 ± 14%"
    assert tables.gap_cell([0.5]) == "50%"
    assert tables.gap_cell([0.5, None]) == "n/a (no gap)", "a teacher no better than the initialisation: null"
    assert tables.gap_cell([float("nan")]) == "n/a (no gap)"


def test_every_marked_prose_figure_is_the_one_its_record_gives():
    """Each `<!-- fig: STUDY/NAME -->…<!-- /fig -->` of docs/results.md holds what docs/results/tables.py forms from
    the record (issue 55: prose figures had drifted from their records)."""
    tables = results_tables()
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    quoted_figures = tables.quoted_figures(text)
    assert len(quoted_figures) == text.count("<!-- fig: ") == text.count("<!-- /fig -->"), "a marker left open"
    assert [name for name, quoted, _ in quoted_figures if "<!--" in quoted] == [], "a marker inside another"
    drifted = [f"{name}: the page says {quoted!r}, the record {record!r}"
               for name, quoted, record in quoted_figures if quoted != record]
    assert drifted == [], "run python docs/results/tables.py --write"
    assert tables.fill(text) == text


# The sections of docs/results.md whose prose figures are all generated (or listed below), by their headings: every
# section of the page (a test fails when the page has one this list does not name).
COVERED = ["intro", "Study 1 ", "Study 2 ", "Study 3 ", "Study 4 ", "Study 5 ", "Study 6 ", "Study 7 ",
           "bf16 on the CPU ", "Distillation across tokenizers ", "Re-running"]
# Figures of the prose that are settings or givens, not results: the phrase that holds them, and why.
SETTINGS = {
    "95% CI": "the interval's level", "97.5% CI": "the interval's level at α/2",
    "97.5% intervals": "the interval's level at α/2", "80% power": "the power the verdict rule asks for",
    "(printed beside its own p and 95% interval) is below 0.05": "the level of the verdict rule",
    "(0.05 over the family's size)": "the level of the verdict rule",
    "3 distillation runs of 4.1 M tokens each": "seeds-scale-converged.yaml's distillation budget",
    "two one-sided tests at 5% (the 90% interval)": "the level of the equivalence test",
    "t_{0.975} is 12.7 at one degree of freedom, 4.3 at two": "Student's t quantiles, not results",
    "PyTorch 2.13": "a version",
    "(about\n11% of the corpus": "the token budget's share of corpus/biomed.txt: a setting",
    "with 10% warm-up": "a schedule setting", "(10% warm-up)": "a schedule setting",
    "hold out a seeded 10%": "a setting",
    "0.2·CE": "the loss's weight: a setting", "0.5·T²·KL(teacher ‖ student) + 0.5·CE": "the loss's weights: settings",
    "(weight 1 against 0.2 for the labels)": "the loss's weights: settings",
    "the same seeded 15% of the training": "the labelled budget: a setting",
    "seeded 15% labelled budget": "the labelled budget: a setting",
    "from a 15% label budget": "the demo's labelled budget: a setting",
    "`int8_smooth: 0.8`": "a setting of the deploy stage",
    "α 0.8 chosen on dev": "the setting the record beside it chose",
    "The target of 98%": "Study 6's target (issue 33), not a result",
    "above 0.5 for": "the decision threshold",
    '75% of ChemProt is "False"': "a property of the data set (its label shares), not a result",
    "scores F1 0.67 on this balanced test set, one that\ncalls none 0.0": "F1 of a constant prediction: arithmetic",
    'which scores F1 0.67 (all "related") or 0.0 (none)': "F1 of a constant prediction: arithmetic",
}
# Figures of the prose no committed record holds: the prose says where they come from (those of records in the
# repository's history are checked against those records: test_figures_of_records_in_the_repositorys_history_...).
NOT_IN_A_RECORD = {
    "mean 0.29, sd 0.07, above 0.5 for 0.5% of the 384 sentences, against\n  mean 0.51, sd 0.28, 52% on GAD's":
        "Study 2's cached teacher outputs, not committed (the prose says so)",
    "(mean 0.29 and 0.22, sd 0.07 and 0.08; the same caches)": "Study 2's cached teacher outputs (the prose says so)",
    "−2.4 and −3.0 (`git show 12b264b^": "Study 6's earlier record, in the repository's history (the prose names "
                                           "the commit)",
    "moved by up to\n  1.7 F1 between the two runs": "Study 6's earlier record against this one",
    "graphs lost 0.5-1.7 F1 (that record)": "Study 6's earlier record (the commit named above)",
    "deploy 27.5 min by the shell's clock": "the shell's timing of the stage (the prose says so)",
    "5.2 s quiet, in the stage's training log": "the stage's training log, not committed (the prose says so)",
    "scored 77.9 and 79.3": "runs set aside, outside the record (the prose says so)",
    "**1.9–2.0×** the tokens/s": "bench/throughput.py runs no committed record holds (the prose says so)",
    "starts at 0.19–0.24 (the training logs": "the cross-tokenizer stages' training logs, not committed",
    "end at 0.49-0.54 from their starting\n  0.5": "Study 3's meta.jsonl in its run folders, not committed (the prose "
                                                  "says so)",
}
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*\.\d+|(?<![\w.])\d+(?:\.\d+)?\s?%")


def _prose(text: str) -> dict[str, str]:
    """The page's prose by section ("intro" before the first heading), without its tables, code or figure markers."""
    text = re.sub(r"<!-- tables: (\S+) -->.*?<!-- end: \1 -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!-- fig: \S+ -->.*?<!-- /fig -->", "FIG", text, flags=re.S)
    parts = re.split(r"^## ", text, flags=re.M)
    return {"intro": parts[0], **{part.split("\n", 1)[0]: part for part in parts[1:]}}


def test_every_figure_of_the_covered_prose_is_generated_or_a_listed_setting():
    """Every decimal figure and percentage in the prose of the COVERED sections is inside a figure marker, or in a
    phrase of SETTINGS (a setting, not a result) or NOT_IN_A_RECORD (the prose says where it comes from)."""
    sections = _prose((DOCS / "results.md").read_text(encoding="utf-8"))
    assert [title for title in sections if not any(title.startswith(c) for c in COVERED)] == [], \
        "a section of the page that COVERED does not name"
    assert [c for c in COVERED if not any(title.startswith(c) for title in sections)] == [], "a COVERED heading is gone"
    prose = "\n".join(sections.values())
    listed = {**SETTINGS, **NOT_IN_A_RECORD}
    assert [phrase for phrase in listed if phrase not in prose] == [], "a listed phrase is no longer in the prose"
    for phrase in sorted(listed, key=len, reverse=True):  # a phrase inside a longer one: the longer first
        prose = prose.replace(phrase, "LISTED")
    unmarked = [prose[max(0, m.start() - 40):m.end() + 20] for m in NUMBER.finditer(prose)]
    assert unmarked == [], "mark each with <!-- fig: STUDY/NAME --> (docs/results/tables.py FIGURES)"


def _record_at(commit: str, name: str) -> dict:
    """docs/results/NAME.json as the repository's history holds it at `commit`."""
    shown = subprocess.run(["git", "show", f"{commit}:docs/results/{name}.json"], cwd=DOCS.parent, capture_output=True,
                           text=True, check=False)
    if shown.returncode:
        pytest.skip(f"no git history here to read {commit}:docs/results/{name}.json from")
    return json.loads(shown.stdout)


def _history_figures() -> list[str]:
    """The phrases of NOT_IN_A_RECORD that quote a record of the repository's history, formed from that record."""
    tables = results_tables()
    old = {stage["name"]: stage for stage in _record_at("12b264b^", "seeds-scale")["stages"]}
    rows = {row["arm"]: row["scores"] for row in old["study"]["summary"]["rows"]}
    new = {row["arm"]: row["scores"] for row in {s["name"]: s for s in tables.load("seeds-scale")["stages"]}["study"][
        "summary"]["rows"]}
    seeds = max(abs(100 * (a - b)) for arm in rows for a, b in zip(rows[arm], new[arm], strict=True))
    kd = [tables.compare_scores(rows[a], rows[b]).difference for a, b in (("kd-6x768", "ft-6x768"),
                                                                          ("kd-3x384", "ft-3x384"))]
    cells = {cell["model"]: cell["test"]["f1"] for cell in old["deploy"]["deploy"]["results"]["cells"]}
    loss = [100 * (cells[arm] - cells[f"{arm}-onnx-int8"]) for arm in ("ft-6x768", "kd-6x768", "ft-6x768-distilled")]
    teacher_ms = next(row["latency"]["128"]["median_ms"] for row in old["deploy"]["deploy"]["bench"]["models"]
                      if row["label"] == "teacher")
    return [f"{tables.signed(kd[0], 1, 100)} and {tables.signed(kd[1], 1, 100)} (`git show 12b264b^",
            f"moved by up to\n  {seeds:.1f} F1 between",
            f"graphs lost {min(loss):.1f}-{max(loss):.1f} F1 (that record)", f"against {teacher_ms:.0f} ms);"]


def test_figures_of_records_in_the_repositorys_history_are_the_ones_those_records_give():
    text = (DOCS / "results.md").read_text(encoding="utf-8")
    assert [phrase for phrase in _history_figures() if phrase not in text] == []


def test_study_4s_table_takes_the_gap_and_the_teacher_seeds_from_a_record_that_has_them():
    """Study 4's replacement (users-setting-converged.yaml: two teacher seeds, `reference_arm: budget`) records each
    arm's gap closed with its bootstrap interval on test and dev: the table prints those, not the difference's
    interval scaled by a fixed gap, and names the teacher's seeds with their dev-selected steps."""
    tables = results_tables()
    summary = json.loads((DOCS / "results" / "users-setting.json").read_text())
    for task, record in summary["teachers"].items():
        record["teacher_seeds"] = {"1": {"test": {"f1": 0.801}, "best_step": 425},
                                   "2": {"test": {"f1": 0.793}, "best_step": 340}}
        for row in summary["rows"]:
            if row["task"] == task and row["arm"] != "budget":
                row["gap"] = {"estimate": 0.456, "low": 0.301, "high": 0.612}
                row["gap_dev"] = {"why_none": "no dev predictions"}
    table = tables.users_setting_tables(summary)
    assert "the mean of seeds 1 (80.1, dev checkpoint at step 425) and 2 (79.3, dev checkpoint at step 340)" in table
    assert "| gap closed | gap closed, dev |" in table
    assert "| 46% (30% to 61%) | – |" in table and "| 46% (30% to 61%); paper 48.4% | – |" in table
    assert "64% to 116%" not in table, "the fixed-gap interval of the first record is gone"
