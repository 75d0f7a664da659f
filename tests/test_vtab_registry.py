"""Every VTAB-1k task (data/vtab.py's TASKS), each tested on its own, as vit_jax's
test_all_tested guards its registries: a task cannot land without its label range and its
slices checked (the 19 tasks as a whole: test_vtab.py's test_registry_is_vtab_1k)."""

from __future__ import annotations

import pytest

from vitlab.data.vtab import TASKS, task_label, task_splits

# The two ends of each label kind's range, as a source stores the features (VTAB's
# definitions, task_adaptation/data/*.py): the first class and the last.
EXTREMES = {
    "label": lambda t: ({"label": [0]}, {"label": [t.classes - 1]}),
    "clevr_count": lambda t: ({"objects/size": [0] * 3}, {"objects/size": [0] * 10}),  # 3..10 objects
    "clevr_distance": lambda t: ({"objects/pixel_coords": [0.0, 0.0, 1.0]}, {"objects/pixel_coords": [0.0, 0.0, 50.0]}),
    "kitti_distance": lambda t: ({"objects/location": [0.0, 0.0, 1.0], "objects/type": [0]},  # a car at 1 m
                                {"objects/location": [], "objects/type": []}),  # no vehicle: the last class
    "dsprites_location": lambda t: ({"label_x_position": [0]}, {"label_x_position": [31]}),
    "dsprites_orientation": lambda t: ({"label_orientation": [0]}, {"label_orientation": [39]}),
    "smallnorb_azimuth": lambda t: ({"label_azimuth": [0]}, {"label_azimuth": [17]}),
    "smallnorb_elevation": lambda t: ({"label_elevation": [0]}, {"label_elevation": [8]}),
}


def test_every_label_kind_has_its_range_here():
    assert {t.label for t in TASKS.values()} == set(EXTREMES), "a task's label kind has no EXTREMES entry"


@pytest.mark.parametrize("name", TASKS)
def test_each_task_spans_its_classes_and_takes_800_plus_200_apart_from_its_test(name):
    task = TASKS[name]
    first, last = EXTREMES[task.label](task)
    assert (task_label(task, first), task_label(task, last)) == (0, task.classes - 1)
    sizes = {s.split("[")[0]: 100_000 for s in (task.train800, task.val200, task.test)}
    splits = task_splits(task, sizes)
    assert [stop - start for _, start, stop in splits["train800"]] == [800]
    assert [stop - start for _, start, stop in splits["val200"]] == [200]
    assert splits["train800val200"] == splits["train800"] + splits["val200"]
    # no example in two of the 800, the 200 and the test
    parts = [splits["train800"][0], splits["val200"][0], *splits["test"]]
    for i, (split_a, a0, a1) in enumerate(parts):
        for split_b, b0, b1 in parts[i + 1:]:
            assert split_a != split_b or a1 <= b0 or b1 <= a0, (name, parts)
