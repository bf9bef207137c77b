"""Models: loading teachers and students, building students, and asking models for features."""
