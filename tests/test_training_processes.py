"""`training.processes` in one process: the static assignment of cells by expected cost, a launch of one (every
meeting a no-op), the refusal to share cells out over processes that already train together, and the expected cost
of evaluation cells. Launches of two processes: tests/test_multiprocess.py."""

import pytest
import torch

from biodistil.errors import BiodistilError
from biodistil.training.processes import Launch, assign, computed_on_main, is_main_process


def loads(costs: list[float], owners: list[int], processes: int) -> list[float]:
    return [sum(c for c, o in zip(costs, owners, strict=True) if o == p) for p in range(processes)]


def test_equal_costs_go_round_robin_and_the_most_expensive_cells_are_placed_first():
    assert assign([1.0] * 7, 3) == [0, 1, 2, 0, 1, 2, 0]
    # plan order alternates a big and a small model: round robin would give process 0 every big cell
    costs = [6.0, 3.0] * 4
    owners = assign(costs, 2)
    assert loads(costs, owners, 2) == [18.0, 18.0] and owners != [0, 1] * 4
    owners = assign([5.0, 4.0, 3.0, 3.0, 3.0], 2)
    assert owners == [0, 1, 1, 0, 1] and loads([5.0, 4.0, 3.0, 3.0, 3.0], owners, 2) == [8.0, 10.0]
    assert assign([], 4) == [] and assign([2.0, 1.0], 4) == [0, 1]


def test_outside_a_launch_every_meeting_is_the_one_process_itself(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    launch = Launch.current()
    assert (launch.index, launch.count, launch.is_main) == (0, 1, True) and is_main_process()
    with launch.main_first():
        launch.wait()
    assert launch.from_main(lambda: [1, 2]) == [1, 2] and computed_on_main(lambda: "x") == "x"
    assert launch.share([3.0, 1.0, 2.0]) == [0, 1, 2]


def test_processes_that_already_train_together_cannot_share_cells_out(tmp_path, monkeypatch):
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(BiodistilError, match="Launch the evaluation or study on its own"):
            Launch.current()
    finally:
        torch.distributed.destroy_process_group()


def test_an_evaluation_cell_costs_its_models_layers_times_its_examples(tmp_path, teacher_dir):
    from kd_fixtures import write_pair_task

    from biodistil.config import validate_recipe
    from biodistil.evaluation.recipe import EvaluateRecipe
    from biodistil.evaluation.runner import check_models, expected_costs, plan_cells, plan_tasks

    task = write_pair_task(tmp_path / "qa", sizes={"train": 40, "dev": 8, "test": 8})

    def costs(entry: object) -> list[float]:
        recipe = validate_recipe(EvaluateRecipe, {
            "run": {"output_dir": str(tmp_path / "ev")}, "num_seeds": 2, "tasks": [entry], "train": {"epochs": 2},
            "models": [{"name": "full", "path": str(teacher_dir)},
                       {"name": "half", "path": str(teacher_dir), "layers": [0, 2]}]})
        cells = plan_cells(check_models(recipe, tmp_path / "ev"), plan_tasks(recipe)[0], recipe.seeds)
        assert [cell.label for cell in cells] == ["full", "half"] * 2
        return expected_costs(cells, None)

    full = costs(str(task))
    assert full[0] == full[2] == 2 * full[1] == 2 * full[3], "4 layers cost twice 2 layers of the same width"
    assert costs({"name": str(task), "max_examples": 10})[0] == pytest.approx(full[0] / 4), "10 of 40 examples"
