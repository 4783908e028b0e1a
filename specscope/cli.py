"""The ``specscope`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from specscope import __version__


def _models(args: argparse.Namespace) -> int:
    from specscope import tiny_models

    try:
        paths = tiny_models.build()
    except ImportError as exc:
        print(f"specscope: building the tiny models needs the 'cpu' or 'vllm' extra ({exc.name} missing)",
              file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({k: str(v) for k, v in paths.items()}))
    else:
        for name, path in paths.items():
            print(f"{name:<16} {path}  {tiny_models.DRAFTS.get(name, 'target model')}")
    return 0


class _Parser(argparse.ArgumentParser):
    """Bad input: one clear line on stderr and exit code 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``specscope`` argument parser."""
    parser = _Parser(prog="specscope", description="Observability for speculative decoding in vLLM.")
    parser.add_argument("--version", action="version", version=f"specscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    models = sub.add_parser("models", help="build (or find) the tiny local target and draft models")
    models.add_argument("--json", action="store_true", help="print {name: path} as JSON")
    models.set_defaults(func=_models)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``specscope`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
