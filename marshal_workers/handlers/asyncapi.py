"""The application as an AsyncAPI 3.0 document (``marshal-workers asyncapi MODULE:APP``; docs/asyncapi.md).

What it says, from the App alone (pure: an App in, a JSON-able dict out; nothing is connected):

- each handler's topic is a channel the app *receives* from, its message's payload the handler's model as a JSON
  schema (msgspec Structs and dataclasses through msgspec, pydantic models through pydantic), or any value for a
  handler that takes Messages; the operation says the group, the delivery mode and the handler's docstring;
- each dead-lettering handler's ``TOPIC.dlq`` is a channel the app *sends* to: the original message with the
  headers a dead letter carries;
- each topic declared with ``app.sends(topic, Model)`` is a channel the app sends to (``app.send`` sends to any
  topic; only the declared ones are described).

Every model's schema is in ``components.schemas``, referred to by ``$ref``, so a model used by several channels is
written once.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from marshal_workers.errors import ConfigError
from marshal_workers.handlers.serializers import BUILT_IN, is_pydantic_model, serializer_name
from marshal_workers.protocol.dead_letter_groups import CLIENT_ID_HEADER, GROUP_HEADER

ASYNCAPI_VERSION = "3.0.0"
KAFKA_BINDING_VERSION = "0.5.0"
_REF = "#/components/schemas/{name}"
_CONTENT_TYPES = {"json": "application/json", "msgpack": "application/msgpack"}
_MODES = {"alo": "at least once", "amo": "at most once"}
# What a dead letter carries besides the original message's own headers (kafka/dead_letter_writer.py writes them).
DEAD_LETTER_HEADERS = {
    "error": "repr() of the error, at most 2,000 characters",
    "error_type": "the error's class name, e.g. ValueError or PayloadError",
    "traceback": "the traceback, when the error was raised (its end kept, at most 8 KiB)",
    "handler": "module.function of the handler",
    "original_topic": "the topic the message came from",
    "original_partition": "its partition",
    "original_offset": "its offset",
    "deliveries": "a shared handler's message: how many times it was delivered",
    GROUP_HEADER: "the group whose worker wrote the dead letter",
    CLIENT_ID_HEADER: "that worker's client id",
}


@dataclass
class _Schemas:
    """The models' JSON schemas, each once, by name, for ``components.schemas``."""

    found: dict[str, Any] = field(default_factory=dict)
    models: dict[str, type] = field(default_factory=dict)

    def ref(self, model: type) -> dict[str, Any]:
        name = model.__name__
        known = self.models.get(name)
        if known is not None and known is not model:
            raise ConfigError(
                f"two models are called {name} ({known.__module__} and {model.__module__}): the "
                "AsyncAPI document names schemas by class name; rename one"
            )
        if known is None:
            self.models[name] = model
            self._add(model)
        return {"$ref": _REF.format(name=name)}

    def _add(self, model: type) -> None:
        if is_pydantic_model(model):
            schema = model.model_json_schema(ref_template=_REF.replace("{name}", "{model}"))  # type: ignore[attr-defined]
            self.found.update(schema.pop("$defs", {}))
            self.found[model.__name__] = schema
            return
        try:
            _, components = msgspec.json.schema_components([model], ref_template=_REF)
        except TypeError as exc:
            raise ConfigError(
                f"{model.__name__} has no JSON schema ({exc}): use a msgspec Struct, a dataclass or a pydantic model"
            ) from None
        self.found.update(components)


def asyncapi_document(
    app: Any, title: str | None = None, version: str = "1.0.0", brokers: str | None = None
) -> dict[str, Any]:
    """The AsyncAPI document of ``app`` (an App).  ``title``: the document's (default: the group, or "application");
    ``brokers``: host:port[,...] to name as its servers (none if not given)."""
    schemas = _Schemas()
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    group = app.group
    for topic in app.topics:
        spec = app.handlers[topic]
        model = None if spec.model is None else spec.model.model
        name = _message_name(topic, model)
        messages[name] = _message(model, spec.serializer, schemas, f"What the handler of {topic} gets.")
        channels[_key(topic)] = _channel(topic, name)
        operations[_key(f"receive_{topic}")] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{_key(topic)}"},
            "messages": [{"$ref": f"#/channels/{_key(topic)}/messages/{name}"}],
            "summary": f"{spec.name}: {_MODES[spec.mode.value]}"
            + (", in batches" if spec.batch else "")
            + (", shared partitions" if spec.shared else ""),
            **({"description": inspect.cleandoc(doc)} if (doc := (spec.declared or spec.function).__doc__) else {}),
            **(
                {
                    "bindings": {
                        "kafka": {
                            "groupId": {"type": "string", "enum": [group]},
                            "bindingVersion": KAFKA_BINDING_VERSION,
                        }
                    }
                }
                if group
                else {}
            ),
        }
        if spec.on_error.value == "dlq":
            dead = f"{name}DeadLetter"
            messages[dead] = _message(
                model,
                spec.serializer,
                schemas,
                f"A message of {topic} its handler failed on, with why.",
                dead_letter=True,
            )
            channels[_key(spec.dlq_topic)] = _channel(spec.dlq_topic, dead)
            operations[_key(f"dead_letter_{topic}")] = {
                "action": "send",
                "channel": {"$ref": f"#/channels/{_key(spec.dlq_topic)}"},
                "messages": [{"$ref": f"#/channels/{_key(spec.dlq_topic)}/messages/{dead}"}],
                "summary": f"the messages of {topic} its handler failed on, after its retries",
            }
    for topic, output in sorted(app.outputs.items()):
        if _key(topic) in channels:  # a topic the app also handles: one channel, a send operation besides
            name = next(iter(channels[_key(topic)]["messages"]))
        else:
            name = _message_name(topic, output.model)
            serializer = output.serializer or BUILT_IN["json"]
            messages[name] = _message(output.model, serializer, schemas, output.description or f"Sent to {topic}.")
            channels[_key(topic)] = _channel(topic, name)
        operations[_key(f"send_{topic}")] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{_key(topic)}"},
            "messages": [{"$ref": f"#/channels/{_key(topic)}/messages/{name}"}],
            "summary": output.description or f"app.send to {topic}",
        }
    document: dict[str, Any] = {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": title or group or "application",
            "version": version,
            "description": "Generated by marshal-workers from the application's handlers.",
        },
        "defaultContentType": "application/json",
    }
    if brokers:
        document["servers"] = {
            _key(f"kafka_{i}"): {"host": host.strip(), "protocol": "kafka"}
            for i, host in enumerate(brokers.split(","))
            if host.strip()
        }
    document |= {
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": dict(sorted(schemas.found.items()))},
    }
    return document


def asyncapi_json(app: Any, title: str | None = None, version: str = "1.0.0", brokers: str | None = None) -> bytes:
    """The document as the command prints it and the dashboard serves it (``/asyncapi.json``): indented JSON."""
    return orjson.dumps(asyncapi_document(app, title, version, brokers), option=orjson.OPT_INDENT_2) + b"\n"


def _channel(topic: str, message: str) -> dict[str, Any]:
    return {
        "address": topic,
        "messages": {message: {"$ref": f"#/components/messages/{message}"}},
        "bindings": {"kafka": {"topic": topic, "bindingVersion": KAFKA_BINDING_VERSION}},
    }


def _message(
    model: type | None, serializer: Any, schemas: _Schemas, summary: str, dead_letter: bool = False
) -> dict[str, Any]:
    name = model.__name__ if model is not None else "Message"
    found: dict[str, Any] = {"name": f"{name}DeadLetter" if dead_letter else name, "summary": summary}
    found["contentType"] = _CONTENT_TYPES.get(serializer_name(serializer), "application/octet-stream")
    if model is None:
        found["payload"] = {"description": "any value (the handler takes Messages: nothing is decoded)"}
    elif dead_letter:  # the original value as it came, which a PayloadError's did not decode into the model
        found["payload"] = {
            "anyOf": [
                schemas.ref(model),
                {"description": "a value that did not decode (error_type PayloadError), as it came"},
            ]
        }
    else:
        found["payload"] = schemas.ref(model)
    if dead_letter:
        found["headers"] = {
            "type": "object",
            "properties": {name: {"type": "string", "description": why} for name, why in DEAD_LETTER_HEADERS.items()},
        }
    return found


def _message_name(topic: str, model: type | None) -> str:
    return model.__name__ if model is not None else _key(f"{topic}_message")


def _key(text: str) -> str:
    """A component key AsyncAPI accepts (letters, digits, '.', '-', '_'); topic names are made of those already."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)
