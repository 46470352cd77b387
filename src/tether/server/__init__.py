"""The task service: tether runs over HTTP with live events, approvals and cancel (see app.py)."""

from tether.server._app import build_app, create_app
from tether.server._registry import Registry, RegistryError, load_registry
from tether.server._tasks import ServiceConfig, TaskError, Tasks

__all__ = ["Registry", "RegistryError", "ServiceConfig", "TaskError", "Tasks", "build_app", "create_app",
           "load_registry"]
