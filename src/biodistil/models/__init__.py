"""Models: loading teachers and students (`loading`), saving a trained model as a Hugging Face folder (`saving`),
building students, and asking models for features."""
