"""The built-in models' ``model_args``: names, defaults, ranges and the checks across
them, read without torch.

Trainers build a built-in task from these values; the coordinator reads them too, at
admission, so a bad argument is refused there with INVALID_ARGUMENT. It used to be
admitted, and every trainer then failed to build the model ("the model cannot be
loaded"), a job FAILED for a typo. Arguments are strings on the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from stalwart.errors import ErrorKind, StalwartError


@dataclass(frozen=True)
class IntArg:
    default: int
    low: int = 1
    high: int = 1 << 31


def _heads_divide_dim(model: str, values: dict[str, int]) -> None:
    if values["dim"] % values["heads"]:
        raise invalid(f"{model}: dim {values['dim']} must be a multiple of heads {values['heads']}")


def _touched_within_rows(model: str, values: dict[str, int]) -> None:
    if values["touched"] > values["rows"]:
        raise invalid(
            f"{model}: touched ({values['touched']}) must not exceed rows ({values['rows']})"
        )


SCHEMAS: dict[str, dict[str, IntArg]] = {
    "digits-cnn": {"width": IntArg(32, high=512)},
    "mlp": {
        "inputs": IntArg(256, high=1 << 20),
        "hidden": IntArg(1024, high=1 << 16),
        "layers": IntArg(4, high=64),
        "classes": IntArg(10, low=2, high=1 << 16),
    },
    "embedding": {
        "rows": IntArg(100_000, high=1 << 28),
        "dim": IntArg(16, high=1 << 14),
        "touched": IntArg(64),
        "hidden": IntArg(64, high=1 << 14),
        "classes": IntArg(8, low=2, high=1 << 14),
    },
    "char-lm": {
        "context": IntArg(64, low=2, high=4096),
        "dim": IntArg(64, low=4, high=4096),
        "layers": IntArg(2, high=64),
        "heads": IntArg(4, high=64),
        "dropout_pct": IntArg(10, low=0, high=90),
    },
}
_CHECKS: dict[str, Callable[[str, dict[str, int]], None]] = {
    "char-lm": _heads_divide_dim,
    "embedding": _touched_within_rows,
}


def parse(model: str, args: Mapping[str, str]) -> dict[str, int]:
    """Every argument of built-in ``model``, given or default; INVALID_ARGUMENT for an
    unknown name, a value that is not an integer or out of its range, or values that
    do not go together."""
    schema = SCHEMAS[model]
    unknown = set(args) - set(schema)
    if unknown:
        raise invalid(f"{model}: unknown model_args {sorted(unknown)}; known: {sorted(schema)}")
    values = {name: _int(model, name, args.get(name), arg) for name, arg in schema.items()}
    check = _CHECKS.get(model)
    if check is not None:
        check(model, values)
    return values


def _int(model: str, name: str, raw: str | None, arg: IntArg) -> int:
    if raw is None or raw == "":
        return arg.default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(f"{model}: model_args[{name!r}] must be an integer, got {raw!r}") from None
    if not arg.low <= value <= arg.high:
        raise invalid(
            f"{model}: model_args[{name!r}] must be in [{arg.low}, {arg.high}], got {value}"
        )
    return value


def invalid(message: str) -> StalwartError:
    """INVALID_ARGUMENT with ``message``: a bad model argument or task (models.base too)."""
    return StalwartError(ErrorKind.INVALID_ARGUMENT, message)
