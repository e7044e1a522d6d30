"""Typed handlers: what a handler's first parameter is annotated with says what it gets (docs/handlers.md).

    def on_order(order: Order)              the value decoded into Order
    def on_order(msg: Message[Order])       the Message, with the decoded value as ``msg.body``
    def on_orders(orders: list[Order])      (batch=True) the values; list[Message[Order]] for the Messages

``Order``: a ``msgspec.Struct``, a dataclass or a pydantic model.  An annotation that names no model and no
``Message[...]`` (none, ``Message``, ``list[Message]``, ``Any``, ``str``...): the handler gets Messages as it
always did, and nothing is decoded (no cost).  One that names a model in a form that cannot be honoured
(``Order | None``, ``dict[str, Order]``, ``Message[int | str]``) is refused at registration with what to write.

:func:`plan_for` reads the annotation (pure: a function in, a :class:`ModelPlan` or None out); :func:`typed`
wraps the handler in a function of Messages, so every runner calls it as it calls any handler.  The value is
decoded once per call of the wrapper, before the handler; one that does not decode raises :class:`PayloadError`
(a ``Reject``: dead-lettered at once, never retried).  A batch's good messages are handled, its bad ones carried
by the error (``PayloadError.by_position``) to the dead-letter topic.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from marshal_workers.errors import ConfigError
from marshal_workers.handlers.serializers import (
    BUILT_IN,
    Decode,
    decoder,
    is_pydantic_model,
    is_pydantic_validation_error,
    serializer_name,
)
from marshal_workers.handlers.signals import PayloadError

_UNTYPED_NAMES = {"Message", "Any", "object", "list", "list[Message]", "List[Message]", "Sequence[Message]"}


@dataclass(frozen=True)
class ModelPlan:
    """How a typed handler's messages are decoded: into ``model``, by ``decode``; handed over as Messages
    (``msg.body``) or as the values alone."""

    model: type
    as_message: bool  # Message[Order] (or list of them): the Message with msg.body; else the value
    decode: Decode
    serializer: str  # its name, for the errors


def check_serializer(where: str, serializer: Any) -> Any:
    """A serializer: a built-in one by name, or the user's object with decode and encode (``where``: "handler for
    'orders'", for the error)."""
    if isinstance(serializer, str):
        if serializer not in BUILT_IN:
            raise ConfigError(
                f"{where}: serializer must be 'json', 'msgpack' or an object with decode(data, type) "
                f"and encode(value), got {serializer!r}"
            )
        return BUILT_IN[serializer]
    if not (callable(getattr(serializer, "decode", None)) and callable(getattr(serializer, "encode", None))):
        raise ConfigError(
            f"{where}: serializer {serializer!r} has no decode(data, type) and encode(value) methods; "
            "give one that has, or 'json' or 'msgpack'"
        )
    return serializer


def plan_for(function: Callable[..., Any], topic: str, batch: bool, serializer: Any, message: type) -> ModelPlan | None:
    """The decoding plan of ``function``'s first parameter's annotation; None: an untyped handler (Messages).
    ``message``: the Message class (handlers/app.py, which calls this)."""
    annotation = _first_annotation(function)
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        annotation = _resolved(function, topic, annotation)
        if annotation is None:
            return None
    where = f"handler for {topic!r}"
    what = _type_name(annotation)
    if _is_untyped(annotation, message):
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, Sequence, Iterable) and len(args) == 1:
        if not batch:
            raise ConfigError(
                f"{where}: its parameter is annotated {what}, a list, but the handler takes one message; pass "
                "batch=True for a batch handler, or annotate one model (order: Order)"
            )
        item = args[0]
    else:
        if batch:
            raise ConfigError(
                f"{where}: a batch handler gets a list; annotate its parameter list[{what}] (or list[Message[...]])"
            )
        item = annotation
    as_message = typing.get_origin(item) is message
    model = typing.get_args(item)[0] if as_message else item
    if as_message and len(typing.get_args(item)) != 1:
        raise ConfigError(f"{where}: Message takes one model class, as in Message[Order]; got {what}")
    _check_model(where, what, model, message)
    chosen = check_serializer(where, serializer)
    try:
        decode = decoder(chosen, model)
    except TypeError as exc:  # msgspec cannot decode this type
        raise ConfigError(f"{where}: {_type_name(model)} cannot be decoded ({exc}); annotate a model class") from None
    return ModelPlan(model=model, as_message=as_message, decode=decode, serializer=serializer_name(chosen))


def typed(function: Callable[..., Any], plan: ModelPlan, batch: bool) -> Callable[..., Any]:
    """``function`` as the runners call a handler: on a Message (a list of them for a batch), decoding first.
    The one-message wrappers decode inline (one Python call fewer per message than through decode_value)."""
    decode, payload_error, decode_value = plan.decode, _payload_error(plan), _value_decoder(plan)
    if batch:
        body: Callable[[Any], Any] = (lambda msg: msg.with_body(decode_value(msg))) if plan.as_message else decode_value

        @functools.wraps(function)
        def on_batch(msgs: list[Any]) -> Any:
            good, bad = [], {}
            for position, msg in enumerate(msgs):
                try:
                    good.append(body(msg))
                except PayloadError as exc:
                    bad[position] = exc
            if not bad:
                return function(good)
            if good:
                function(good)
            raise PayloadError(f"{len(bad)} of {len(msgs)} messages did not decode: {next(iter(bad.values()))}", bad)

        return on_batch
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def on_message_async(msg: Any) -> Any:
            value = decode_value(msg)
            return await function(msg.with_body(value) if plan.as_message else value)

        return on_message_async
    if plan.as_message:

        @functools.wraps(function)
        def on_message_with_body(msg: Any) -> Any:
            data = msg.value
            try:
                value = decode(data)
            except Exception as exc:  # noqa: BLE001 - whatever the decoder raises, the payload is at fault
                raise payload_error(data, exc) from None
            return function(msg.with_body(value))

        return on_message_with_body

    @functools.wraps(function)
    def on_message(msg: Any) -> Any:
        data = msg.value
        try:
            value = decode(data)
        except Exception as exc:  # noqa: BLE001 - whatever the decoder raises, the payload is at fault
            raise payload_error(data, exc) from None
        return function(value)

    return on_message


def _value_decoder(plan: ModelPlan) -> Callable[[Any], Any]:
    """Message -> model, or PayloadError saying why not (the validator's message: the field's path and reason)."""
    decode, payload_error = plan.decode, _payload_error(plan)

    def decode_value(msg: Any) -> Any:
        data = msg.value
        try:
            return decode(data)
        except Exception as exc:  # noqa: BLE001 - whatever the decoder raises, the payload is at fault
            raise payload_error(data, exc) from None

    return decode_value


def _payload_error(plan: ModelPlan) -> Callable[[bytes | None, Exception], PayloadError]:
    """The PayloadError of a value that did not decode: a tombstone (no value), or the validator's message."""
    model, serializer = plan.model.__qualname__, plan.serializer

    def payload_error(data: bytes | None, error: Exception) -> PayloadError:
        if data is None:
            return PayloadError(f"the message has no value (a tombstone), so no {model} ({serializer})")
        return PayloadError(f"the value does not decode as {model} ({serializer}): {_reason(error)}")

    return payload_error


def _reason(error: Exception) -> str:
    """The validator's message on one line: msgspec's says the path (``at `$.items[0].qty```), pydantic's each
    failing field's location and what is wrong with it."""
    if is_pydantic_validation_error(error):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or '$'}: {e['msg']}" for e in error.errors())  # type: ignore[attr-defined]
    return str(error) or type(error).__name__


def _first_annotation(function: Callable[..., Any]) -> Any:
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin or a callable without a signature: untyped
        return inspect.Parameter.empty
    return parameters[0].annotation if parameters else inspect.Parameter.empty


def _resolved(function: Callable[..., Any], topic: str, annotation: str) -> Any:
    """A string annotation (``from __future__ import annotations``) evaluated in the module the function was
    written in (only this one: the others' may name what is imported under TYPE_CHECKING alone); None if it
    cannot be and names a Message (as it always worked: untyped)."""
    try:  # the app's own code, evaluated as typing.get_type_hints does
        return eval(annotation, function.__globals__)
    except Exception as exc:  # noqa: BLE001 - NameError, or any error of evaluating the user's annotation
        if annotation.replace(" ", "") in _UNTYPED_NAMES:
            return None
        raise ConfigError(
            f"handler for {topic!r}: its parameter's annotation {annotation!r} cannot be resolved ({exc}); import "
            "the model class in the handler's module (not only under TYPE_CHECKING)"
        ) from None


def _is_untyped(annotation: Any, message: type) -> bool:
    """Annotations that ask for no decoding, as before typed handlers: those that name neither a model nor
    ``Message[...]`` (``Message``, ``list[Message]``, ``Any``, but also ``str`` or ``dict``: handlers annotated
    so have always been given Messages, and still are)."""
    return not _asks_for_decoding(annotation, message)


def _asks_for_decoding(annotation: Any, message: type) -> bool:
    """Does the annotation name a model class or ``Message[...]`` anywhere in it?"""
    if typing.get_origin(annotation) is message or _is_model(annotation, message):
        return True
    return any(_asks_for_decoding(arg, message) for arg in typing.get_args(annotation))


def _is_model(cls: Any, message: type) -> bool:
    """A msgspec Struct (not a Message: that one holds a Kafka record), a dataclass or a pydantic model class."""
    return (
        isinstance(cls, type)
        and not issubclass(cls, message)
        and (issubclass(cls, msgspec.Struct) or dataclasses.is_dataclass(cls) or is_pydantic_model(cls))
    )


def _check_model(where: str, what: str, model: Any, message: type) -> None:
    """A msgspec Struct, a dataclass or a pydantic model class: else refused with what to write."""
    if _is_model(model, message):
        return
    raise ConfigError(
        f"{where}: cannot decode messages into {what}: annotate the parameter with one model class (a msgspec.Struct, "
        "a dataclass or a pydantic model), as in order: Order, msg: Message[Order] or, with batch=True, "
        "orders: list[Order]; or leave it unannotated (or Message) to get the Message and decode it yourself"
    )


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")
