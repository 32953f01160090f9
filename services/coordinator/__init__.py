"""Stalwart coordinator service."""
