"""Layer maps: uniform (TinyBERT), explicit, and PatientKD skip / last."""

import pytest

from biodistil.errors import BiodistilError
from biodistil.methods.layer_map import explicit_layer_map, pkd_last_map, pkd_skip_map, uniform_layer_map


@pytest.mark.parametrize(
    ("teacher", "student", "expected"),
    [
        (12, 6, [0, 2, 4, 6, 8, 10, 12, 13]),
        (12, 4, [0, 3, 6, 9, 12, 13]),
        (12, 3, [0, 4, 8, 12, 13]),
        (6, 6, [0, 1, 2, 3, 4, 5, 6, 7]),
        (24, 4, [0, 6, 12, 18, 24, 25]),
        (12, 1, [0, 12, 13]),
        # N not a multiple of M: ⌊l·10/4⌋ = 2, 5, 7, 10
        (10, 4, [0, 2, 5, 7, 10, 11]),
    ],
)
def test_uniform_layer_map(teacher: int, student: int, expected: list[int]) -> None:
    assert uniform_layer_map(student, teacher) == expected


@pytest.mark.parametrize(
    ("student", "teacher", "needle"),
    [
        (0, 12, "num_student_layers"),
        (6, 4, "smaller"),
        (2.5, 12, "integer"),
        (True, 12, "integer"),
        (3, 0, "num_teacher"),
    ],
)
def test_uniform_layer_map_errors(student: object, teacher: object, needle: str) -> None:
    with pytest.raises(BiodistilError, match=needle):
        uniform_layer_map(student, teacher)  # type: ignore[arg-type]


def test_explicit_layer_map_adds_endpoints() -> None:
    assert explicit_layer_map([2, 4, 6], 12) == [0, 2, 4, 6, 13]
    assert explicit_layer_map((1, 12), 12) == [0, 1, 12, 13]


@pytest.mark.parametrize(
    ("layers", "needle"),
    [
        ([], "empty"),
        ([4, 2], "strictly increasing"),
        ([2, 2], "strictly increasing"),
        ([0, 3], "1..12"),
        ([3, 13], "1..12"),
        ([1.5], "1..12"),
    ],
)
def test_explicit_layer_map_errors(layers: list, needle: str) -> None:
    with pytest.raises(BiodistilError, match=needle):
        explicit_layer_map(layers, 12)


@pytest.mark.parametrize(
    ("teacher", "student", "skip", "last"),
    [
        (12, 6, [2, 4, 6, 8, 10], [7, 8, 9, 10, 11]),
        (12, 4, [3, 6, 9], [9, 10, 11]),
        (12, 3, [4, 8], [10, 11]),
        (6, 6, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]),
        (24, 4, [6, 12, 18], [21, 22, 23]),
        (12, 1, [], []),
    ],
)
def test_pkd_maps(teacher: int, student: int, skip: list[int], last: list[int]) -> None:
    students = list(range(1, student))
    assert pkd_skip_map(student, teacher) == list(zip(students, skip, strict=True))
    assert pkd_last_map(student, teacher) == list(zip(students, last, strict=True))


def test_pkd_maps_validate_sizes() -> None:
    with pytest.raises(BiodistilError, match="smaller"):
        pkd_skip_map(6, 3)
    with pytest.raises(BiodistilError, match="num_student_layers"):
        pkd_last_map(0, 12)
