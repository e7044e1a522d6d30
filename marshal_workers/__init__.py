"""marshal-workers: run Python handlers over Kafka partitions, coordinated through Kafka alone."""

from marshal_workers.errors import SoftTimeLimitExceeded
from marshal_workers.handlers.app import App, Message
from marshal_workers.handlers.serializers import Serializer
from marshal_workers.handlers.signals import Ignore, PayloadError, Reject, Retry

__all__ = [
    "App",
    "Ignore",
    "Message",
    "PayloadError",
    "Reject",
    "Retry",
    "Serializer",
    "SoftTimeLimitExceeded",
    "__version__",
]
__version__ = "0.7.0"
