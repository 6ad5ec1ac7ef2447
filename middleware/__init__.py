"""Dramatiq middleware, each configured by constructor arguments; imports nothing of actors/ or settings."""
