"""Copies made from the dataclasses' fields (marshal_workers.protocol.field_copies): equal to the original and
independent of it, for every field the fold's states have."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import pytest
from fold_values import leases, partition_states, shared_partitions
from hypothesis import given
from hypothesis import strategies as st

from marshal_workers.protocol.field_copies import NoCopyRule, copier
from marshal_workers.protocol.member_id import MemberId
from marshal_workers.protocol.range_leases import SharedPartition

states = st.one_of(partition_states(), shared_partitions(), st.integers(0, 100).flatmap(lambda s: leases(s, s + 10)))


def scramble(value: Any) -> None:
    """Change everything that can change in dataclass ``value``: its fields, its containers and their items."""
    for found in fields(value):
        item = getattr(value, found.name)
        inner = item.values() if isinstance(item, dict) else item if isinstance(item, (list, set)) else ()
        for part in list(inner):
            if is_dataclass(part):
                scramble(part)
        if isinstance(item, list):
            item.append(object())
        elif isinstance(item, dict):
            item[object()] = object()
        elif isinstance(item, set):
            item.add(object())
        setattr(value, found.name, object())


@given(states)
def test_a_copy_is_equal_and_changing_it_leaves_the_original_as_it_was(original: Any) -> None:
    before = copy.deepcopy(original)
    copied = original.copy()
    assert type(copied) is type(original) and copied == original
    scramble(copied)
    assert original == before


def test_a_field_of_a_type_without_a_copy_rule_is_named() -> None:
    @dataclass
    class Odd:
        size: int
        nested: list[list[int]] = field(default_factory=list)  # items that are neither immutable nor dataclasses

    with pytest.raises(NoCopyRule, match=r"Odd\.nested: no copy rule"):
        copier(Odd)


@dataclass
class Item:
    seen: set[int] = field(default_factory=set)


@dataclass
class Box:
    items: dict[str, Item] = field(default_factory=dict)
    label: str | None = None


def test_items_that_are_dataclasses_are_copied_by_their_own_copier() -> None:
    box = Box({"a": Item({1})}, "x")
    copied = copier(Box)(box)
    copied.items["a"].seen.add(2)
    assert copied.label == "x" and box.items["a"].seen == {1}


class PlantedLeases(SharedPartition):
    """A subclass, as a test plants a bug in the fold: its copies must keep the bug."""

    def claim(self, start: int, end: int, holder: MemberId, at: int, lease_ms: int, amo: bool) -> bool:
        return True


def test_a_copy_of_a_subclass_keeps_its_class() -> None:
    planted = PlantedLeases(low=0, done=[(1, 2)])
    copied = planted.copy()
    assert type(copied) is PlantedLeases and copied == planted
    copied.done.append((3, 4))
    assert planted.done == [(1, 2)]
