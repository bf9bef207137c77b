"""Tasks: the bottom of the task-specific side, shared by fine-tuning, distillation and evaluation.

`registry` (which tasks exist, their files, labels and metric; `builtin_tasks.yaml`), `metrics` (each task's
official metric), `splits` (reading a split, seeded subsets), `recipe` (the `task:` section of the task-side
recipes), `encoding` (examples into model features and batches), `prediction` (model outputs back to examples
and words) and `scoring` (predictions scored with the official metric). Nothing here trains or distils.
"""
