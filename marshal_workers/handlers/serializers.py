"""How a typed handler's message values turn into models: ``serializer="json"`` (the default), ``"msgpack"``, or an
object of the user's with ``decode(data, type)`` and ``encode(value)`` (docs/handlers.md, "Typed handlers").

Pure: a serializer and a model class in, a ``bytes -> model`` function out, built once per handler at registration.
The built-in ones decode in C where the library allows: msgspec decodes JSON and MessagePack straight into a
``msgspec.Struct`` or a dataclass; a pydantic model validates JSON in pydantic-core (``model_validate_json``).
pydantic is never imported here: a pydantic model's class says it is one (its module is loaded already).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import msgspec

Decode = Callable[[bytes], Any]


@runtime_checkable
class Serializer(Protocol):
    """A user's serializer: ``decode(data, type)`` makes a ``type`` (the handler's model class) of a message's
    value, raising any exception if it cannot (the message is then dead-lettered as a ``PayloadError``);
    ``encode(value)`` makes bytes of one."""

    def decode(self, data: bytes, type: type) -> Any: ...

    def encode(self, value: Any) -> bytes: ...


class JsonSerializer:
    """JSON: msgspec for Structs and dataclasses, pydantic-core for pydantic models."""

    name = "json"

    def decoder_for(self, model: type) -> Decode:
        if is_pydantic_model(model):
            return model.model_validate_json  # type: ignore[attr-defined]  # a pydantic model: checked above
        return msgspec.json.Decoder(model).decode

    def decode(self, data: bytes, type: type) -> Any:
        return self.decoder_for(type)(data)

    def encode(self, value: Any) -> bytes:
        if is_pydantic_model(value.__class__):
            return value.model_dump_json().encode()
        return msgspec.json.encode(value)


class MsgpackSerializer:
    """MessagePack: msgspec, into Structs and dataclasses in C; a pydantic model validates what msgspec read."""

    name = "msgpack"

    def decoder_for(self, model: type) -> Decode:
        if is_pydantic_model(model):
            validate = model.model_validate  # type: ignore[attr-defined]
            read = msgspec.msgpack.Decoder().decode
            return lambda data: validate(read(data))
        return msgspec.msgpack.Decoder(model).decode

    def decode(self, data: bytes, type: type) -> Any:
        return self.decoder_for(type)(data)

    def encode(self, value: Any) -> bytes:
        if is_pydantic_model(value.__class__):
            return msgspec.msgpack.encode(value.model_dump(mode="json"))
        return msgspec.msgpack.encode(value)


BUILT_IN: dict[str, JsonSerializer | MsgpackSerializer] = {"json": JsonSerializer(), "msgpack": MsgpackSerializer()}


def is_pydantic_model(cls: Any) -> bool:
    """Is ``cls`` a pydantic model class?  Without importing pydantic: if no module loaded it, no class is one."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(cls, type) and issubclass(cls, pydantic.BaseModel)


def is_model_value(value: Any) -> bool:
    """Is ``value`` a model a serializer encodes: a msgspec Struct, a dataclass instance or a pydantic model?"""
    if isinstance(value, msgspec.Struct) or is_pydantic_model(type(value)):
        return True
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def is_pydantic_validation_error(error: BaseException) -> bool:
    """Is ``error`` pydantic's ValidationError (its ``errors()`` list each field's location and message)?"""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(error, pydantic.ValidationError)


def serializer_name(serializer: Any) -> str:
    """How a serializer is named in errors: "json", "msgpack", or the user's class."""
    return getattr(serializer, "name", None) or type(serializer).__qualname__


def decoder(serializer: Any, model: type) -> Decode:
    """The ``bytes -> model`` function of ``serializer`` (a built-in one, or the user's) for ``model``."""
    if isinstance(serializer, (JsonSerializer, MsgpackSerializer)):
        return serializer.decoder_for(model)
    decode = serializer.decode
    return lambda data: decode(data, model)
