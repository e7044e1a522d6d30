"""marshal-workers: run Python handlers over Kafka partitions, coordinated through Kafka alone."""

from marshal_workers.app import App, Message
from marshal_workers.errors import Ignore, Reject, Retry, SoftTimeLimitExceeded

__all__ = ["App", "Ignore", "Message", "Reject", "Retry", "SoftTimeLimitExceeded", "__version__"]
__version__ = "0.7.0"
