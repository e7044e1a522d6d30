"""Finding the application from ``MODULE:ATTR`` (gunicorn and Celery style)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from marshal_workers.errors import AppLoadError, NoHandlersError
from marshal_workers.handlers.app import App


def split_app_path(app_path: str) -> tuple[str, str]:
    """``"pkg.module:app"`` -> ("pkg.module", "app"); the attribute defaults to ``app``."""
    module, _, attr = app_path.partition(":")
    if not module or not all(part.isidentifier() for part in module.split(".")) or (attr and not attr.isidentifier()):
        raise AppLoadError(f"{app_path!r} is not of the form MODULE:APP (for example myproject.tasks:app)")
    return module, attr or "app"


def ensure_cwd_importable() -> None:
    """Let ``marshal-workers run app:app`` find app.py in the current directory, like ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def load_app(app_path: str) -> App:
    """Import the module and return its App; every failure is an AppLoadError that says what to fix."""
    module_name, attr = split_app_path(app_path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name or (exc.name and module_name.startswith(exc.name + ".")):
            raise AppLoadError(
                f"cannot import module {module_name!r}: no such module. Run from the directory that contains it, "
                "or add that directory to PYTHONPATH"
            ) from None
        raise AppLoadError(f"importing {module_name!r} failed:\n{traceback.format_exc()}") from None
    except Exception:  # noqa: BLE001 - importing the user's module runs their code: any error is a load error
        raise AppLoadError(f"importing {module_name!r} failed:\n{traceback.format_exc()}") from None
    app = getattr(module, attr, None)
    if app is None:
        raise AppLoadError(
            f"module {module_name!r} has no attribute {attr!r}; name the App object as {module_name}:NAME"
        )
    if not isinstance(app, App):
        raise AppLoadError(f"{module_name}:{attr} is a {type(app).__name__}, not a marshal_workers.App")
    if not app.handlers:
        raise NoHandlersError(f'{module_name}:{attr} has no handlers: register one with @app.handler("topic")')
    return app
