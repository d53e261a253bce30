"""How the command line reports a failed command: one line on stderr, never a stack trace by default.

- a user error (a bad value, a missing or unreadable file, bad JSON or text encoding): `specdec: error: ...`,
  exit status 2, as argparse does for bad arguments;
- Ctrl-C: exit status 130 (128 + SIGINT), quietly;
- anything else is a bug in specdec: `specdec: internal error: ...`, exit status 1.
SPECDEC_DEBUG=1 prints the traceback too, whatever the error.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

DEBUG_ENV = "SPECDEC_DEBUG"
USER_ERRORS = (ValueError, OSError)  # ValueError covers json.JSONDecodeError and UnicodeDecodeError
EXIT_USER_ERROR, EXIT_INTERNAL_ERROR, EXIT_INTERRUPTED = 2, 1, 130


def run_reporting_errors(command: Callable[[], int]) -> int:
    """Runs `command` and returns its exit status, or the status of the error it raised (reported on stderr)."""
    try:
        return command()
    except KeyboardInterrupt:
        _traceback_if_debugging()
        return EXIT_INTERRUPTED
    except USER_ERRORS as exc:
        _traceback_if_debugging()
        print(f"specdec: error: {describe(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:  # noqa: BLE001 - the whole point: no stack trace for the user
        _traceback_if_debugging()
        hint = "" if _debugging() else f" (set {DEBUG_ENV}=1 for the traceback)"
        print(f"specdec: internal error: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def describe(exc: BaseException) -> str:
    """The error's message; for a file error "No such file or directory: 'x.jsonl'" without errno's "[Errno 2]"."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.strerror}: {exc.filename!r}"
    return str(exc) or type(exc).__name__


def _debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _traceback_if_debugging() -> None:
    if _debugging():
        traceback.print_exc()
