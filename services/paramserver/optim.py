"""The paramserver's optimizers: the library's builder, so reference runs build them identically."""

from stalwart.optim import build, export_state, import_state, validate

__all__ = ["build", "export_state", "import_state", "validate"]
