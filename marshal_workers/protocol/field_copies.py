"""Copies of the fold's dataclasses, made from their fields (``dataclasses.fields()`` and the fields' types).

The simulator's members share one fold and copy the state of every partition a record is about before folding it
(``copy_on_write.copy_before``, docs/simulation.md), so a copy is on the hot path: ``copy.deepcopy`` and
``dataclasses.replace`` take several times as long as calling the constructor with the fields.  :func:`copier`
writes that call once per class, from the fields and their types:

* a field of an immutable type (numbers, strings, None, named tuples, frozen dataclasses, tuples and unions of
  them) is shared;
* a list, set or dict of immutable items is copied one level;
* a list or dict whose items are dataclasses is copied item by item, each with its class's copier.

A field of any other type has no rule: :func:`copier` refuses the class and names the field, so a new field is
either copied or stops the import of its module.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_IMMUTABLE_TYPES = (int, float, str, bytes, bool, type(None))
_CONTAINERS = (list, set, dict)


class NoCopyRule(TypeError):
    """A field whose type :func:`copier` has no rule for."""


@functools.cache
def copier(cls: type[T]) -> Callable[[T], T]:
    """A function that returns an equal copy of a ``cls`` sharing nothing mutable with the original."""
    if not dataclasses.is_dataclass(cls):
        raise NoCopyRule(f"{cls.__name__} is not a dataclass")
    hints = typing.get_type_hints(cls)
    names: dict[str, Any] = {"cls": cls, "copier": copier}
    arguments = []
    for found in dataclasses.fields(cls):
        if not found.init:
            raise NoCopyRule(f"{cls.__name__}.{found.name}: a field the constructor does not take")
        value = _copied(hints[found.name], f"self.{found.name}", names, f"{cls.__name__}.{found.name}")
        arguments.append(f"{found.name}={value}" if found.kw_only else value)
    # Generated once, as dataclasses generates __init__: a plain constructor call, the fastest copy Python has.  An
    # instance of a subclass (a test's planted bug) is copied by its own class's copier, so it keeps its class.
    source = (
        "def copy(self):\n"
        "    if type(self) is not cls:\n"
        "        return copier(type(self))(self)\n"
        f"    return cls({', '.join(arguments)})\n"
    )
    exec(source, names)  # noqa: S102  (the source is made of field names only)
    made: Callable[[T], T] = names["copy"]
    made.__qualname__ = f"copier({cls.__name__})"
    return made


def mutable_fields(cls: type) -> tuple[str, ...]:
    """The fields of dataclass ``cls`` whose values can change in place (those a copy that shares nothing copies)."""
    hints = typing.get_type_hints(cls)
    return tuple(found.name for found in dataclasses.fields(cls) if not is_immutable(hints[found.name]))


def _copied(hint: Any, value: str, names: dict[str, Any], where: str) -> str:
    """The expression that copies ``value`` (Python source) of type ``hint``."""
    if is_immutable(hint):
        return value
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in arguments:
        rest = [argument for argument in arguments if argument is not type(None)]
        if len(rest) == 1:
            return f"(None if {value} is None else {_copied(rest[0], value, names, where)})"
    if origin in _CONTAINERS:
        items = arguments[-1] if arguments else Any  # a dict's values, a list's or set's items
        if all(is_immutable(argument) for argument in arguments):
            return f"{value}.copy()"
        if dataclasses.is_dataclass(items) and all(is_immutable(argument) for argument in arguments[:-1]):
            name = f"_copy_{items.__name__}"
            names[name] = copier(items)
            if origin is dict:
                return f"{{key: {name}(item) for key, item in {value}.items()}}"
            if origin is list:
                return f"[{name}(item) for item in {value}]"
    raise NoCopyRule(f"{where}: no copy rule for a field of type {hint!r}")


def is_immutable(hint: Any) -> bool:
    """Can a value of type ``hint`` be shared between a state and its copy (nothing in it can change)?"""
    if hint in _IMMUTABLE_TYPES:
        return True
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType, tuple):
        return all(argument is Ellipsis or is_immutable(argument) for argument in arguments)
    if origin is typing.Literal:
        return True
    if not isinstance(hint, type):
        return False
    if issubclass(hint, enum.Enum):
        return True
    if issubclass(hint, tuple) and hasattr(hint, "_fields"):  # a named tuple: immutable if its fields are
        return all(is_immutable(field_hint) for field_hint in typing.get_type_hints(hint).values())
    if dataclasses.is_dataclass(hint) and hint.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return all(is_immutable(field_hint) for field_hint in typing.get_type_hints(hint).values())
    return False
