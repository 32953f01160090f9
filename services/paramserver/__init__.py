"""Stalwart paramserver service."""
