"""Evaluation: the task registry, official metrics, reports and speed benchmarks."""
