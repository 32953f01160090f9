"""Stalwart health service."""
