"""The job system's core: what is neither an actor nor a middleware (see docs/architecture.md)."""

__version__ = "0.1.0"
