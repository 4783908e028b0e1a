"""The readers: what reads specscope (or vLLM) from outside the engine's processes and shows it to a person or a
pipeline.

The rooms: :mod:`.scrape` (a server's snapshot and metrics over HTTP), :mod:`.promtext` and
:mod:`.prometheus_source` (Prometheus text and a Prometheus server as sources), :mod:`.fleet` (several servers
side by side), :mod:`.report` (the HTML report), :mod:`.figures` (its charts), :mod:`.tui` (``specscope top``) and
:mod:`.evaluate` (drafts compared on your prompts). The top layer but for the commands (:mod:`specscope.cli`,
:mod:`specscope.demo`).
"""
