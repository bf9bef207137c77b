"""Methods: how a masked-LM student is trained. `objective` (a method as a weighted list of loss terms), `masked_lm`
(the module the engine trains), `task_agnostic` (the `pretrain`, `distill` and `cache-teacher` commands), `terms`
(one short function per term form), `vekd`, `layer_map`, and across tokenizers `cross_tokenizer` (which terms a
tokenizer pair allows) and `word_units` (a batch's shared words). The teacher's outputs (run live or read from its
cache) come from `biodistil.teachers`; fine-tuning on a task is `biodistil.finetune`."""
