"""The exceptions users see.  Each message says what to do about it.

    MarshalWorkersError
        ConfigError               bad setting or option; fix it and retry
        EmbeddedBrokerError       the embedded Tansu broker is missing or did not start
        KafkaUnavailable          no broker answered in time (retry later or fix --brokers)
        CoordinationTopicError    the coordination topic is missing and cannot be created
        CoordinationWriteError    a coordination record was not written (retryable)
        UnknownTopicError         a topic named by the user does not exist
        UnknownGroupError         a group named by the user has no record in the coordination log
        AppLoadError              MODULE:APP cannot be imported or is not an App
            NoHandlersError       the App has no handler to run
    DecodeError                   a coordination record is not valid (internal; readers skip it)

Raised inside handlers:

    TimeLimitExceeded
        SoftTimeLimitExceeded     a handler call ran past its soft time limit (catch it to clean up)
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


class UnknownGroupError(MarshalWorkersError):
    """A group given to an admin command has never written to the coordination topic."""


class AppLoadError(MarshalWorkersError):
    """The application named on the command line cannot be loaded."""


class NoHandlersError(AppLoadError):
    """The application registered no handler."""


class DecodeError(ValueError):
    """A coordination record that is not a valid version-1 record."""


class TimeLimitExceeded(Exception):
    """A handler call ran past a time limit."""


class SoftTimeLimitExceeded(TimeLimitExceeded):
    """Raised inside a handler that runs past ``soft_time_limit``.

    Catch it to clean up and return; if it escapes, the message counts as
    failed and the handler's error policy (retries, then dead letter or
    release) applies.  Past ``time_limit`` the worker is killed instead.
    """
