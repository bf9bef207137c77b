"""Task-specific distillation: a student learns a fine-tuned teacher's outputs on a task.

`recipe` (the transfer, kd and study recipes), `transfer` and `random_text` (transfer sets), `teacher_cache`
(teacher outputs computed once), `signal` (cached or online teacher outputs, one interface), `objective` (the
loss as terms of the objective registry), `module` (what the engine trains), `meta` (MetaDistil,
MetaAdaptiveKD), `command` (`biodistil kd`) and `study` (`biodistil study`).
"""
