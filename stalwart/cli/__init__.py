"""The ``stalwart`` command line."""
