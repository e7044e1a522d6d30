"""marshal-workers: run Python handlers over Kafka partitions, coordinated through Kafka alone."""

__version__ = "0.1.0"
