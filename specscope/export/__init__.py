"""What leaves a process: every metric's name, unit and help defined once (:mod:`.catalogue`), and the consumers
that read the hub's snapshot through it.

The rooms: :mod:`.prometheus_export` and :mod:`.otel_export` (the two wire formats), :mod:`.endpoint` (the standalone
HTTP endpoint), :mod:`.exports` (starting them from settings), :mod:`.summary` (the snapshot in words),
:mod:`.dashboards` (Grafana, generated) and :mod:`.alerts` (rules defined once, evaluated in-process and rendered as
Prometheus rules). Imports only :mod:`specscope.core`, :mod:`specscope.verdict` and :mod:`specscope.state`.
"""
