"""Stalwart: self-healing distributed PyTorch training.

The shared library every service stands on: wire codec, errors, settings,
logging, metrics, server and channel bootstrap, client SDK and CLI. It imports
nothing from ``services/``.
"""

__version__ = "0.1.0"
