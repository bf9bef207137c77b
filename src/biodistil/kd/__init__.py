"""Task-specific distillation: a student learns a fine-tuned teacher's outputs on a task.

`recipe` (the transfer, kd and study recipes), `transfer` and `random_text` (transfer sets), `objective` (the
loss as terms of the objective registry), `module` (what the engine trains), `meta` (MetaDistil,
MetaAdaptiveKD), `command` (`biodistil kd`) and `study` (`biodistil study`). The teacher's outputs, stored once or
run online, come through `biodistil.teachers`.
"""
