"""marshal-workers: run Python handlers over Kafka partitions, coordinated through Kafka alone."""

from marshal_workers.app import App, Message

__all__ = ["App", "Message", "__version__"]
__version__ = "0.1.0"
