"""Environment variables of a deployment against the settings the services really read.

A typo in ``LLMESH_CACHE_REDIS_URl`` or a setting renamed in code is silently ignored
by pydantic-settings (``extra="ignore"``); these checks turn it into a test failure.
"""

from __future__ import annotations

import importlib
import inspect
import os
from unittest import mock

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsError

from services.runtime.cli import catalog
from services.runtime.quic.config import QuicSettings
from services.runtime.settings import ServiceSettings
from services.runtime.tls import TLSSettings

# LLMESH_ variables read outside pydantic-settings (services/runtime/settings.py).
OTHER_VARIABLES = {"LLMESH_DATA_DIR", "LLMESH_CONFIG"}


def settings_classes() -> dict[str, type[BaseSettings]]:
    """env prefix -> settings class, for every service in the tree, the QUIC transport and TLS."""
    out: dict[str, type[BaseSettings]] = {"LLMESH_QUIC_": QuicSettings, "LLMESH_TLS_": TLSSettings}
    for spec in catalog.SERVICES:
        module = importlib.import_module(f"{spec.package}.config")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, ServiceSettings) and getattr(cls, "service_name", None) == spec.name:
                out[spec.env_prefix] = cls
    return out


def unknown_variables(env: dict[str, str] | list[str]) -> list[str]:
    """``LLMESH_*`` names in ``env`` that no service reads (``LLMESH_<SERVICE>_<FIELD>`` must name a
    field of that service's settings); other variables (REDIS_URL, OTEL_*, HF_*) are not ours."""
    classes = settings_classes()
    unknown: list[str] = []
    for name in env:
        if not name.startswith("LLMESH_") or name in OTHER_VARIABLES:
            continue
        prefix = next((p for p in classes if name.startswith(p)), None)
        if prefix is None:
            if _service_prefix(name) is None:
                unknown.append(name)
            # else: a service not in this tree yet, nothing to check against
            continue
        field = name.removeprefix(prefix).lower()
        if field not in classes[prefix].model_fields:
            unknown.append(name)
    return unknown


def _service_prefix(name: str) -> str | None:
    return next((s.env_prefix for s in catalog.SERVICES if name.startswith(s.env_prefix)), None)


def settings_errors(env: dict[str, str]) -> list[str]:
    """Loads the settings of every service ``env`` configures from exactly ``env``; returns the
    validation errors (a value of the wrong type, a list that does not parse, ...)."""
    classes = settings_classes()
    errors: list[str] = []
    for prefix, cls in classes.items():
        if not any(name.startswith(prefix) for name in env):
            continue
        with mock.patch.dict(os.environ, {k: str(v) for k, v in env.items()}, clear=True):
            try:
                cls()
            except (ValidationError, SettingsError) as exc:
                errors.append(f"{cls.__name__}: {exc}")
    return errors
