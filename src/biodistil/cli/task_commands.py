"""Task-specific commands: finetune, kd, transfer (registered by `register`)."""

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the `biodistil` parser."""
