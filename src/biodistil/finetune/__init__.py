"""Fine-tuning: a classifier head on an encoder trained on a task with the one engine, above `training` and below
the methods that distil.

`on_task` (`finetune_on_task`: train split, model selection on dev, scores on test; `ClassifierModule`), `selection`
(dev selection and the final test scores, written once and shared with `biodistil.kd.command`), `init_model` (the
model a task-side run starts from: as given, some of its layers, or fresh weights) and `command` (`biodistil
finetune` and its recipe). The classifier itself is built by `biodistil.tasks.classifier`.
"""
