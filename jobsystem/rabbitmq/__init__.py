"""The project's RabbitMQ broker: its topology and dead letters, its consumer, and bulk sends."""
