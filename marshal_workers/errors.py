"""The exceptions users see.  Each message says what to do about it.

    MarshalWorkersError
        ConfigError               bad setting or option; fix it and retry
        EmbeddedBrokerError       the embedded Tansu broker is missing or did not start
        KafkaUnavailable          no broker answered in time (retry later or fix --brokers)
        CoordinationTopicError    the coordination topic is missing and cannot be created
        CoordinationWriteError    a coordination record was not written (retryable)
        UnknownTopicError         a topic named by the user does not exist
        TopicCreationError        ``topics create``: the cluster refused to create a topic
        UnknownGroupError         a group named by the user has no record in the coordination log
        AppLoadError              MODULE:APP cannot be imported or is not an App
            NoHandlersError       the App has no handler to run
        AppStartupError           an ``on_startup`` hook of the App failed: the supervisor stops before claiming
        OffsetRangeError          a range of offsets (replay --from/--to) is not inside the topic's log
        SparkUnavailableError     pyspark is not installed, or Spark (Java) cannot start
        SparkJobError             a Spark job failed (a split could not be read)
            ReplayFailedError     a handler still failed after its retries; the replay is incomplete
    DecodeError                   a coordination record is not valid (internal; readers skip it)
    StopRequested                 a stop signal came during a start-up step (internal; the supervisor exits 0)

Raised inside handlers:

    TimeLimitExceeded
        SoftTimeLimitExceeded     a handler call ran past its soft time limit (catch it to clean up)

Raised in a worker, which then crashes (its input is handled again, at least once):

    SendError                     a message given to app.send() was not confirmed by Kafka

Raised by app.flush() outside a worker: SendError, a message sent from the process was not confirmed.
"""

from __future__ import annotations


class MarshalWorkersError(Exception):
    """Base of every error marshal-workers reports to users."""


class ConfigError(MarshalWorkersError):
    """A setting has a bad value."""


class EmbeddedBrokerError(MarshalWorkersError):
    """The embedded broker cannot be found or did not start."""


class KafkaUnavailable(MarshalWorkersError):
    """Kafka did not answer within the connect timeout."""


class CoordinationTopicError(MarshalWorkersError):
    """The coordination topic is missing and could not be created, or is unusable."""


class CoordinationWriteError(MarshalWorkersError):
    """A coordination record could not be written or confirmed in time."""


class UnknownTopicError(MarshalWorkersError):
    """A topic given by the user does not exist on the cluster."""


class TopicCreationError(MarshalWorkersError):
    """The cluster refused to create a topic (``topics create``)."""


class UnknownGroupError(MarshalWorkersError):
    """A group given to an admin command has never written to the coordination topic."""


class AppLoadError(MarshalWorkersError):
    """The application named on the command line cannot be loaded."""


class NoHandlersError(AppLoadError):
    """The application registered no handler."""


class AppStartupError(MarshalWorkersError):
    """An ``@app.on_startup`` hook raised: ``run`` stops before it claims anything."""


class OffsetRangeError(MarshalWorkersError):
    """A range of offsets or times does not fit the topic's log (from after to, beyond the end, ...)."""


class SparkUnavailableError(MarshalWorkersError, ImportError):
    """pyspark is missing (an ImportError too, so ``import marshal_workers.spark`` fails as imports do), or no JVM."""


class SparkJobError(MarshalWorkersError):
    """A Spark job did not complete."""


class ReplayFailedError(SparkJobError):
    """A replayed handler failed after its retries: the replay did not cover its whole range."""


class DecodeError(ValueError):
    """A coordination record that is not a valid version-1 record."""


class StopRequested(Exception):
    """SIGTERM or SIGINT came while a start-up step waited on Kafka: the step gives up, the supervisor stops."""


class TimeLimitExceeded(Exception):
    """A handler call ran past a time limit."""


class SoftTimeLimitExceeded(TimeLimitExceeded):
    """Raised inside a handler that runs past ``soft_time_limit``.

    Catch it to clean up and return; if it escapes, the message counts as
    failed and the handler's error policy (retries, then dead letter or
    release) applies.  Past ``time_limit`` the worker is killed instead.
    """


class WorkerLost(Exception):
    """The worker died (a segfault, running out of memory, os._exit) while handling a message, ``crash_limit``
    times in a row with no progress: the message is dead-lettered with this as its ``error_type``."""


class SendError(Exception):
    """A message given to ``app.send()`` was not confirmed by Kafka: the worker stops before reporting progress
    past the input it came from, so that input is handled again."""


class MaxDeliveriesExceeded(Exception):
    """A shared handler's message was delivered ``max_deliveries`` times without success: it is dead-lettered
    with this as its ``error_type``."""


class MessageTooOld(Exception):
    """A message older than its handler's ``max_age`` when its worker got to it, with ``on_too_old="dlq"``: it is
    dead-lettered with this as its ``error_type`` instead of being handled."""
