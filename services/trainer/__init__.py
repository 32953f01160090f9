"""Stalwart trainer service."""
