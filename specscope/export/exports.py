"""Starting specscope's exports for a hub: the Prometheus/JSON endpoint and OTLP, from arguments or the environment.

``vllm serve`` users configure it with environment variables (the stat-logger plugin calls :func:`from_env`):

- ``SPECSCOPE_PROMETHEUS_PORT`` (and ``SPECSCOPE_PROMETHEUS_HOST``, default 127.0.0.1): serve ``/metrics`` and
  ``/snapshot``; with ``SPECSCOPE_API_KEY``, only to requests carrying ``Authorization: Bearer <key>``;
- ``SPECSCOPE_OTLP=1``: export over OTLP, configured by the standard ``OTEL_*`` variables;
  ``SPECSCOPE_OTLP=global``: through the process's global OpenTelemetry providers instead (as
  ``opentelemetry-instrument`` with a distro, or the application, configured them);
- ``SPECSCOPE_ALERTS=1``: evaluate the alert rules in-process and log transitions; ``SPECSCOPE_ALERTS_JSONL``
  (a file) and ``SPECSCOPE_ALERTMANAGER_URL`` add notifiers, ``SPECSCOPE_ALERT_THRESHOLDS`` (a JSON or YAML
  file) changes thresholds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specscope.export.endpoint import DEFAULT_HOST, Endpoint, EndpointError
from specscope.export.otel_export import OtelConfig, OtelConfigError, OtelExporter, resolve_config
from specscope.state.hub import Hub

log = logging.getLogger("specscope")


class ExportConfigError(ValueError):
    """Bad export configuration (one line, fit for the user)."""


@dataclass
class Exports:
    """Running exports; :meth:`close` stops them."""

    endpoint: Endpoint | None = None
    otel: OtelExporter | None = None
    alerts: Any = None
    problems: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Stop serving, stop evaluating alerts, flush OTLP."""
        if self.alerts is not None:
            self.alerts.stop()
        if self.endpoint is not None:
            self.endpoint.close()
        if self.otel is not None:
            self.otel.shutdown()


def start(hub: Hub, *, prometheus_port: int | None = None, prometheus_host: str = DEFAULT_HOST,
          otlp: bool | OtelConfig = False, meter_provider: Any = None, tracer_provider: Any = None,
          api_key: str | None = None) -> Exports:
    """Start the endpoint (when a port is given; ``api_key``: the bearer token it requires) and OTLP export
    (``True``: from ``OTEL_*``); raise on bad config.

    With ``otlp``, ``meter_provider`` / ``tracer_provider`` (for example ``opentelemetry.metrics.
    get_meter_provider()``) carry specscope's metrics and spans instead of providers of its own."""
    config = None
    if otlp:
        try:
            config = otlp if isinstance(otlp, OtelConfig) else resolve_config()
        except OtelConfigError as exc:
            raise ExportConfigError(str(exc)) from None
    exports = Exports()
    if prometheus_port is not None:
        try:
            exports.endpoint = Endpoint(hub.snapshot, prometheus_host, prometheus_port, api_key=api_key)
        except EndpointError as exc:
            raise ExportConfigError(str(exc)) from None
    if config is not None:
        exports.otel = OtelExporter(hub, config, meter_provider=meter_provider, tracer_provider=tracer_provider)
    return exports


#: ``SPECSCOPE_OTLP`` values: specscope's own OTLP providers, the process's global ones, or none.
_OTLP = {"1": "own", "true": "own", "yes": "own", "on": "own", "global": "global",
         "": None, "0": None, "false": None, "no": None, "off": None}


def settings_from_env(env: dict[str, str] | None = None) -> tuple[int | None, str, str | None]:
    """``(prometheus port, host, otlp: "own", "global" or None)`` from the ``SPECSCOPE_*`` variables; raises on
    bad values."""
    env = dict(os.environ) if env is None else env
    raw = env.get("SPECSCOPE_PROMETHEUS_PORT", "").strip()
    port = None
    if raw:
        if not raw.isdigit() or not 0 <= int(raw) < 65536:
            raise ExportConfigError(f"SPECSCOPE_PROMETHEUS_PORT must be a port number, got {raw!r}")
        port = int(raw)
    host = env.get("SPECSCOPE_PROMETHEUS_HOST", DEFAULT_HOST).strip() or DEFAULT_HOST
    raw = env.get("SPECSCOPE_OTLP", "").strip().lower()
    if raw not in _OTLP:
        raise ExportConfigError(f"SPECSCOPE_OTLP must be 1 (specscope's own OTLP export), global (the process's "
                                f"OpenTelemetry providers) or 0, got {raw!r}")
    return port, host, _OTLP[raw]


def from_env(hub: Hub, env: dict[str, str] | None = None, lead: Callable[[str], bool] | None = None) -> Exports:
    """Start what the environment asks for; a bad setting is logged in one line and skipped, never raised.

    ``lead(role)``: whether this process is the one of its server to serve ``role`` ("prometheus", "otlp",
    "alerts"), for a server with several API-server processes; the others leave the role to it.
    """
    env = dict(os.environ) if env is None else env
    try:
        port, host, otlp = settings_from_env(env)
        want_alerts = env.get("SPECSCOPE_ALERTS", "").strip().lower() in ("1", "true", "yes", "on")
        if lead is not None:
            others = [role for role, wanted in (("prometheus", port is not None), ("otlp", otlp),
                                                ("alerts", want_alerts)) if wanted and not lead(role)]
            if others:
                log.info("specscope: another API-server process of this server serves %s", ", ".join(others))
            port = None if "prometheus" in others else port
            otlp = None if "otlp" in others else otlp
            want_alerts = want_alerts and "alerts" not in others
        thresholds = None
        if want_alerts and env.get("SPECSCOPE_ALERT_THRESHOLDS"):
            from specscope.export.alerts.rules import RuleConfigError, load_thresholds

            try:
                thresholds = load_thresholds(env["SPECSCOPE_ALERT_THRESHOLDS"])
            except RuleConfigError as exc:
                raise ExportConfigError(str(exc)) from None
        providers: dict[str, Any] = {}
        if otlp == "global":
            from opentelemetry import metrics, trace

            providers = {"meter_provider": metrics.get_meter_provider(), "tracer_provider": trace.get_tracer_provider()}
        exports = start(hub, prometheus_port=port, prometheus_host=host, otlp=otlp is not None,
                        api_key=env.get("SPECSCOPE_API_KEY") or None, **providers)
        if want_alerts:
            from specscope.export import alerts

            exports.alerts = alerts.start(hub, thresholds, jsonl=env.get("SPECSCOPE_ALERTS_JSONL") or None,
                                          alertmanager=env.get("SPECSCOPE_ALERTMANAGER_URL") or None)
        return exports
    except ExportConfigError as exc:
        log.error("specscope: export not started: %s", exc)
        hub.health.count_error("export config", exc)
        return Exports(problems=[str(exc)])
