"""Methods: how a masked-LM student is trained. `objective` (a method as a weighted list of loss terms),
`masked_lm` (the module the engine trains), `teacher_signal` and `teacher_cache` (the teacher run live or read from
its cache), `task_agnostic` (the `pretrain`, `distill` and `cache-teacher` commands), `vekd`, `layer_map`; and
`finetune`, a classifier head trained on a task (shared by `finetune`, studies and `evaluate`)."""
