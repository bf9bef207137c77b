"""The `biodistil` command line: a thin layer that reads recipes and calls the pipeline."""
