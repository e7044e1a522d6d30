"""marshal-workers: run Python handlers over Kafka partitions, coordinated through Kafka alone."""

from marshal_workers.errors import SoftTimeLimitExceeded
from marshal_workers.handlers.app import App, Message
from marshal_workers.handlers.signals import Ignore, Reject, Retry

__all__ = ["App", "Ignore", "Message", "Reject", "Retry", "SoftTimeLimitExceeded", "__version__"]
__version__ = "0.7.0"
