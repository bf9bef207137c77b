"""The results format of `biodistil evaluate` (and `evaluate --finetuned`): `results.json` in a run folder.

Writers (`biodistil.evaluation.runner`, `biodistil.evaluation.finetuned`) and readers (`biodistil.evaluation.
aggregate`, the report) share this module, so that neither side imports the other. A results file holds:

    format        RESULTS_FORMAT
    complete      false while cells are missing
    reference     the model the report compares the others with
    seeds         the seeds run ([] when models were scored without training)
    models        [{label, path, parameters[, runtime, precision]}]
    tasks         [{name, family, metric, headline, folds, settings...}]
    skipped_tasks [{task, reason}]
    summary       {model: {task: {family, metric, headline, mean, median, std, n, seeds, metrics_mean, ...}}}
    cells         one record per finished cell
    notes         optional remarks the report repeats
"""

from pathlib import Path
from typing import Any

from biodistil.errors import BiodistilError
from biodistil.io import read_json

RESULTS_FORMAT = "biodistil-evaluate/1"
RESULTS_FILE = "results.json"


def read_results(run: Path) -> dict[str, Any]:
    """The results of an evaluation run folder, checked to be in this format."""
    path = run / RESULTS_FILE
    if not path.is_file():
        raise BiodistilError(f"{run}: no results.json; expected the output folder of `biodistil evaluate`")
    results = read_json(path)
    if not isinstance(results, dict) or results.get("format") != RESULTS_FORMAT:
        raise BiodistilError(f"{path}: not a biodistil evaluation result (expected format {RESULTS_FORMAT})")
    return results
