"""Bad input to a command: one line on stderr, ``specscope: error: ...``, and exit code 2 (the one home of that idiom
for ``specscope``'s commands, ``top`` and ``evaluate``)."""

from __future__ import annotations

import sys

#: The exit code of a command given bad input.
EXIT_BAD_INPUT = 2


class UsageError(ValueError):
    """Bad arguments: one line, exit code 2."""


def fail(message: object) -> int:
    """Print ``specscope: error: <message>`` on stderr; return :data:`EXIT_BAD_INPUT` for the command to return."""
    print(f"specscope: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT
