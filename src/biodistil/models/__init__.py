"""Models: loading teachers and students (`loading`), saving a trained model as a Hugging Face folder (`saving`),
what differs between model families (`families`), building students (`student`, `vocab_expansion`,
`vocab_transfer`), asking models for features (`features`, `attention`, `qkv`, `logits`), their size (`size`) and
a cheaper CPU dropout (`dropout`)."""
