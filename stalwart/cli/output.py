"""How the CLI speaks: one renderer per format, named exit codes, errors on stderr.

Data goes to stdout (a rich table, or one JSON document with ``--output json``);
problems go to stderr as a single ``Error: ...`` line with a non-zero exit code.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import wraps
from pathlib import Path
from typing import Any

import grpc
import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stalwart.errors import RpcError, StalwartError


class Output(enum.StrEnum):
    table = "table"
    json = "json"


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1  # the command ran and the answer is "no" (e.g. a check failed)
    INVALID_INPUT = 2
    UNREACHABLE = 3  # could not connect, or timed out
    REFUSED = 4  # the cluster answered with an error


OUTPUT_OPTION = typer.Option(
    Output.table, "--output", "-o", help="table for people, json for scripts"
)

_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_INVALID = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


def error_line(message: str) -> None:
    """The one line every refusal of the CLI prints, on stderr."""
    print(f"Error: {message}", file=sys.stderr)


def fail(message: str, code: ExitCode) -> None:
    error_line(message)
    raise typer.Exit(int(code))


def check_output_file(path: Path, flag: str) -> None:
    """Exit 2 unless ``path`` can name a file to write: not a folder (an empty value
    is the current one), in a folder that exists. Checked before any work, so a
    bad name costs no fetch and writes nothing."""
    if path.is_dir():
        fail(f"{flag} {str(path)!r} is a folder: give a file name in it", ExitCode.INVALID_INPUT)
    if not path.parent.is_dir():
        fail(f"{flag} {str(path)!r}: no folder {str(path.parent)!r}", ExitCode.INVALID_INPUT)


PIPED_WIDTH = 200


def cli_errors(fn: Callable) -> Callable:
    """Turn errors from the client SDK into one readable line and an exit code."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RpcError as err:
            _fail_rpc(err, f"{err.reason}: {err.message}")
        except grpc.RpcError as exc:
            err = RpcError.from_grpc(exc)
            _fail_rpc(err, f"{err.code.name}: {err.message}")
        except StalwartError as err:
            fail(str(err), ExitCode.INVALID_INPUT)
        except OSError as exc:  # a path that cannot be made, read or written
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}", ExitCode.INVALID_INPUT)
        except ValueError as exc:  # a value the wire cannot carry (an int past int64...)
            fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                 ExitCode.INVALID_INPUT)  # fmt: skip

    return wrapper


def _fail_rpc(err: RpcError, refused: str) -> None:
    """One line and the exit code for an RPC that failed; ``refused``: the line for a
    refusal by the cluster."""
    if err.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        fail(f"cannot reach the cluster: no answer in time ({err.message}); --timeout "
             "gives a slow cluster longer", ExitCode.UNREACHABLE)  # fmt: skip
    if err.code in _UNREACHABLE:
        fail(f"cannot reach the cluster: {err.message}", ExitCode.UNREACHABLE)
    if err.code == grpc.StatusCode.UNIMPLEMENTED:
        fail(f"the address answers but does not serve this call ({err.message}): is it "
             "the right service's address?", ExitCode.INVALID_INPUT)  # fmt: skip
    fail(refused, ExitCode.INVALID_INPUT if err.code in _INVALID else ExitCode.REFUSED)


def to_data(value: Any) -> Any:
    if isinstance(value, Message):
        # Zeros too: slot 0 and step 0 had no key at all, unlike slot 1 and step 1.
        return json_format.MessageToDict(
            value, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    return value


def emit_json(value: Any) -> None:
    print(json.dumps(to_data(value), indent=2, sort_keys=False, default=str))


def emit_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")  # a narrow terminal wraps an id, never cuts it
    for row in rows:
        table.add_row(*(table_cell(v) for v in row))
    table_console().print(table)


def table_cell(value: Any) -> Text:
    """A value as a table shows it: plain text, never markup (a reason holding
    ``[red]`` stays as written), and control characters escaped (an ESC sequence in a
    job's reason, set by any client, used to reach the terminal and restyle it)."""
    text = "" if value is None else str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return Text(text)


def table_console() -> Console:
    """Where tables go: the terminal's width, or, piped (a script, a log), wide enough that
    ids and addresses, which the next command needs whole, are never cut short."""
    return Console(width=None if Console().is_terminal else PIPED_WIDTH)


def emit_mapping(title: str, data: Mapping[str, Any]) -> None:
    emit_table(title, ["field", "value"], [(k, v) for k, v in data.items()])


def emit(output: Output, data: Any, for_people: Callable[[], None]) -> None:
    """``data`` as JSON for scripts; for people, what ``for_people`` prints."""
    if output is Output.json:
        emit_json(data)
    else:
        for_people()


def emit_record(
    output: Output, title: str, data: Any, fields: Callable[[Any], Mapping[str, Any]] | None = None
) -> None:
    """One record: ``data`` as JSON, or a field/value table of ``fields(data)`` (or ``data``)."""
    emit(output, data, lambda: emit_mapping(title, fields(data) if fields else data))


def emit_rows(
    output: Output,
    title: str,
    columns: Sequence[str],
    items: Sequence[Any],
    row: Callable[[Any], Sequence[Any]],
    data: Callable[[Any], Any] = to_data,
) -> None:
    """A table with one ``row(item)`` a line, or a JSON list of ``data(item)``."""
    emit(output, [data(i) for i in items], lambda: emit_table(title, columns, map(row, items)))
