"""The shared state store (Redis or SQLite) and the features' operations on it."""
