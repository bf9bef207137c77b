"""The teacher's side of distillation, task-agnostic and task-specific alike.

`loading` (a fine-tuned teacher checked against its task; freezing), `store` (the one store of teacher outputs: its
key rule — `teacher_fingerprint`, what a teacher *is*, and `entry_key` —, root, the Arrow table format, read
memory-mapped),
`masked_lm_cache` (a masked-LM teacher's outputs per corpus block and mask pattern), `task_cache` (a fine-tuned
teacher's outputs per transfer example, and its test scores), and `signal` (`TeacherSignal`: the interface a
distillation module reads the teacher through, online or from the store).
"""
