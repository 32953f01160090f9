"""Errors raised by the job's own code (the task's import, model, batch, loss), kept
apart from the platform's: a user's bug is reported to the coordinator, which fails
the job with it, instead of killing the trainer that ran it.

:func:`user_code` wraps the calls into user code: any exception other than the
platform's own (:class:`StalwartError` and subclasses, which keep their meaning)
comes out as :class:`UserCodeError` with the exception's type, message and the
innermost frame outside the platform and its libraries (the user's file:line).
No grpc, no torch.
"""

from __future__ import annotations

import contextlib
import os
import sysconfig
import traceback
from collections.abc import Iterator

from stalwart import limits
from stalwart.errors import StalwartError

IMPORT = "import"
STEP = "step"

# Frames in these trees are the platform's or a library's, not the user's.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_USER = tuple(
    os.path.normpath(p) + os.sep
    for p in {
        os.path.join(_ROOT, "stalwart"),
        os.path.join(_ROOT, "services"),
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    }
)


# What a machine's accelerator or memory raises rather than the job's code: torch's
# types for a full or broken GPU, and the messages of its allocators and drivers (a
# CUDA error is a plain RuntimeError). One trainer's report of one says nothing
# about the job: the same model ran elsewhere (services/coordinator/taskerrors.py).
MACHINE_ERROR_TYPES = frozenset({"OutOfMemoryError", "AcceleratorError"})
# how a trainer's own memory check ends its message (services/trainer/joberrors.py)
TRAINER_SHORT_OF_MEMORY = "more memory than this one has available"
MACHINE_MESSAGE_MARKS = (
    "CUDA error", "CUDA out of memory", "CUBLAS_STATUS", "cuDNN error", "HIP error",
    "DefaultCPUAllocator: can't allocate memory", TRAINER_SHORT_OF_MEMORY,
)  # fmt: skip


def machine_fault(error_type: str, message: str) -> bool:
    """Whether an error is one a machine's device or memory raises (see above)."""
    return error_type in MACHINE_ERROR_TYPES or any(m in message for m in MACHINE_MESSAGE_MARKS)


class UserCodeError(Exception):
    """User code raised; ``location`` is "file:line in function" of the user's frame."""

    def __init__(self, phase: str, error_type: str, message: str, location: str = "") -> None:
        super().__init__(f"{error_type}: {message}" + (f" ({location})" if location else ""))
        self.phase = phase
        self.error_type = error_type[: limits.MAX_ID]
        self.message = message[: limits.MAX_REASON]
        self.location = location[: limits.MAX_LOCATION]
        self.slot = -1
        self.step = -1


def user_location(exc: BaseException) -> str:
    """The innermost traceback frame in the user's code (else the innermost frame at all).

    A SyntaxError names the user's file and line itself."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if _is_user_file(f.filename)]
    chosen = mine[-1] if mine else (frames[-1] if frames else None)
    return f"{chosen.filename}:{chosen.lineno} in {chosen.name}" if chosen else ""


def _is_user_file(filename: str) -> bool:
    path = os.path.normpath(os.path.abspath(filename)) if not filename.startswith("<") else ""
    return bool(path) and not path.startswith(_NOT_USER)


def describe(phase: str, exc: BaseException) -> UserCodeError:
    message = str(exc) or repr(exc)
    return UserCodeError(phase, type(exc).__name__, message, user_location(exc))


@contextlib.contextmanager
def user_code(phase: str, *, slot: int = -1, step: int = -1) -> Iterator[None]:
    """Run user code: its exceptions become :class:`UserCodeError` (platform errors pass)."""
    try:
        yield
    except (StalwartError, UserCodeError):
        raise
    except Exception as exc:
        err = describe(phase, exc)
        err.slot, err.step = slot, step
        raise err from exc
