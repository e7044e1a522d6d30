"""Finding the application from MODULE:APP, and the errors that say what to fix."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from marshal_workers import App
from marshal_workers.errors import AppLoadError, NoHandlersError
from marshal_workers.handlers.loader import ensure_cwd_importable, load_app, split_app_path

GOOD_APP = """
    from marshal_workers import App

    app = App(group="billing")

    @app.handler("orders")
    def on_order(msg):
        return msg
"""

WriteModule = Callable[..., str]


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WriteModule]:
    """Write ``<name>.py`` into an importable directory; the modules are forgotten after the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created: list[str] = []

    def write(source: str, name: str | None = None) -> str:
        name = name or f"mw_loader_{uuid.uuid4().hex[:10]}"
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        importlib.invalidate_caches()
        created.append(name)
        return name

    yield write
    tops = {name.split(".")[0] for name in created}
    for loaded in [m for m in sys.modules if m.split(".")[0] in tops]:
        del sys.modules[loaded]


def unique_name(prefix: str = "mw_loader") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------ split_app_path


@pytest.mark.parametrize(
    ("app_path", "expected"),
    [
        ("pkg.mod:app", ("pkg.mod", "app")),
        ("tasks:application", ("tasks", "application")),
        ("mod", ("mod", "app")),
        ("pkg.sub.mod", ("pkg.sub.mod", "app")),
        ("mod:", ("mod", "app")),
        ("_private:_app", ("_private", "_app")),
    ],
)
def test_split_app_path(app_path: str, expected: tuple[str, str]) -> None:
    assert split_app_path(app_path) == expected


@pytest.mark.parametrize(
    "app_path",
    [
        "",
        ":app",
        "a b:c",
        "mod:1x",
        "mod:app:x",
        "1mod:app",
        "pkg..mod:app",
        ".mod:app",
        "mod.:app",
        "mod:a-b",
        "my-app:app",
    ],
)
def test_split_app_path_refuses_bad_forms(app_path: str) -> None:
    with pytest.raises(AppLoadError, match="MODULE:APP"):
        split_app_path(app_path)


def test_load_app_refuses_bad_forms_before_importing() -> None:
    with pytest.raises(AppLoadError, match="MODULE:APP"):
        load_app("mod:app:x")


# ------------------------------------------------------------------ load_app


def test_load_app_returns_the_app(write_module: WriteModule) -> None:
    name = write_module(GOOD_APP)
    app = load_app(f"{name}:app")
    assert isinstance(app, App)
    assert app.group == "billing"
    assert list(app.topics) == ["orders"]
    assert app is sys.modules[name].app


def test_load_app_defaults_to_the_attribute_app(write_module: WriteModule) -> None:
    name = write_module(GOOD_APP)
    assert load_app(name) is sys.modules[name].app


def test_load_app_with_another_attribute_name(write_module: WriteModule) -> None:
    name = write_module(
        """
        from marshal_workers import App

        workers = App(group="billing")
        workers.handler("orders")(print)
        app = "not the App"
        """
    )
    assert load_app(f"{name}:workers") is sys.modules[name].workers


def test_load_app_from_a_package(write_module: WriteModule) -> None:
    package = unique_name("mw_pkg")
    write_module("", f"{package}.__init__")
    write_module(GOOD_APP, f"{package}.tasks")
    app = load_app(f"{package}.tasks:app")
    assert list(app.topics) == ["orders"]


def test_missing_module_says_cannot_import_and_mentions_pythonpath() -> None:
    name = unique_name("mw_absent")
    with pytest.raises(AppLoadError, match="cannot import module") as info:
        load_app(f"{name}:app")
    assert name in str(info.value)
    assert "PYTHONPATH" in str(info.value)


def test_missing_module_in_an_existing_package_says_cannot_import(write_module: WriteModule) -> None:
    package = unique_name("mw_pkg")
    write_module("", f"{package}.__init__")
    with pytest.raises(AppLoadError, match="cannot import module") as info:
        load_app(f"{package}.nope:app")
    assert f"{package}.nope" in str(info.value)


def test_module_that_raises_at_import_shows_the_traceback(write_module: WriteModule) -> None:
    name = write_module(
        """
        from marshal_workers import App

        app = App(group="g")
        DATABASE_URL = {}["DATABASE_URL_SENTINEL"]
        """
    )
    with pytest.raises(AppLoadError) as info:
        load_app(f"{name}:app")
    message = str(info.value)
    assert "Traceback" in message
    assert "KeyError: 'DATABASE_URL_SENTINEL'" in message
    assert f"{name}.py" in message  # the user's file, so they can find the line
    assert 'DATABASE_URL = {}["DATABASE_URL_SENTINEL"]' in message
    assert "no such module" not in message


def test_module_importing_a_missing_dependency_shows_that_import_error(write_module: WriteModule) -> None:
    dependency = unique_name("mw_dep")
    name = write_module(f"import {dependency}\n")
    with pytest.raises(AppLoadError) as info:
        load_app(f"{name}:app")
    message = str(info.value)
    assert f"No module named '{dependency}'" in message
    assert "no such module" not in message, "the app module exists; its dependency is what is missing"


def test_missing_dependency_whose_name_starts_the_app_module_name_is_still_a_dependency_error(
    write_module: WriteModule,
) -> None:
    # e.g. redis_tasks.py doing `import redis` without redis installed
    dependency = unique_name("mw_dep")
    name = write_module(f"import {dependency}\n", f"{dependency}_tasks")
    with pytest.raises(AppLoadError) as info:
        load_app(f"{name}:app")
    message = str(info.value)
    assert f"No module named '{dependency}'" in message
    assert "no such module" not in message, "the app module exists; its dependency is what is missing"


def test_missing_attribute_is_named(write_module: WriteModule) -> None:
    name = write_module(GOOD_APP)
    with pytest.raises(AppLoadError, match="'application'") as info:
        load_app(f"{name}:application")
    assert name in str(info.value)
    assert type(info.value) is AppLoadError


def test_attribute_that_is_not_an_app_is_refused(write_module: WriteModule) -> None:
    name = write_module("app = {'group': 'g'}\n")
    with pytest.raises(AppLoadError, match="not a marshal_workers.App") as info:
        load_app(f"{name}:app")
    assert "dict" in str(info.value)


def test_app_with_no_handlers_is_refused(write_module: WriteModule) -> None:
    name = write_module("from marshal_workers import App\n\napp = App(group='g')\n")
    with pytest.raises(NoHandlersError, match="no handlers") as info:
        load_app(f"{name}:app")
    assert isinstance(info.value, AppLoadError)
    assert issubclass(NoHandlersError, AppLoadError)


# ----------------------------------------------------- ensure_cwd_importable


def test_ensure_cwd_importable_inserts_the_cwd_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["/somewhere/site-packages"])
    cwd = os.getcwd()
    ensure_cwd_importable()
    assert sys.path == [cwd, "/somewhere/site-packages"]
    ensure_cwd_importable()
    assert sys.path == [cwd, "/somewhere/site-packages"]


def test_ensure_cwd_importable_leaves_a_path_that_has_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cwd = os.getcwd()
    monkeypatch.setattr(sys, "path", ["/somewhere/site-packages", cwd])
    ensure_cwd_importable()
    assert sys.path == ["/somewhere/site-packages", cwd]


def test_ensure_cwd_importable_leaves_a_path_that_has_the_empty_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", "/somewhere/site-packages"])  # "" already means the cwd
    ensure_cwd_importable()
    assert sys.path == ["", "/somewhere/site-packages"]


def test_after_ensure_cwd_importable_an_app_in_the_cwd_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_name("mw_cwd")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(GOOD_APP), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    try:
        importlib.invalidate_caches()
        with pytest.raises(AppLoadError, match="cannot import module"):
            load_app(f"{name}:app")
        ensure_cwd_importable()
        importlib.invalidate_caches()
        assert list(load_app(f"{name}:app").topics) == ["orders"]
    finally:
        sys.modules.pop(name, None)
