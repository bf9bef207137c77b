"""Tasks: the bottom of the task-specific side, shared by fine-tuning, distillation and evaluation.

`registry` (which tasks exist, their files, labels and metric; `builtin_tasks.yaml`), `metrics` (each task's
official metric), `splits` (reading a split, seeded subsets), `recipe` (the `task:` section of the task-side
recipes), `classifier` (a fresh task head on an encoder), `encoding` (examples into model features and batches;
unlabelled texts through an `EncodingSpec`, a model's head and labels without a task), `prediction` (model outputs
back to examples and words), `scoring` (predictions scored with the official metric) and `significance` (the verdict
rule for two arms' per-seed scores). Nothing here trains or distils.
"""
