"""Everything that runs inside vLLM's processes, and the ways into them.

Ways in: :mod:`.wrapper` (``specscope.LLM`` / ``AsyncLLM``), :func:`.vllm_engine.instrument` (an engine made
elsewhere), :mod:`.instrumentation` (the OpenTelemetry instrumentor), the ``vllm serve`` plugins (:mod:`.vllm_logger`,
the stat logger; :mod:`.plugin`, loaded in every process) and :mod:`.middleware` (the ASGI middleware on vLLM's API
server). All of them end at one door, :mod:`.door`: what specscope turns on for an engine. Collectors:
:mod:`.vllm_config` and :mod:`.vllm_stats` (vLLM's config and stats read into the model), :mod:`.vllm_hook`
(per-request hooks), :mod:`.vllm_engine` (an engine's hub and its start-up checks), :mod:`.forward_timer` (the
target's forward, timed where it runs), :mod:`.gpu_source` with :mod:`.nvml` and :mod:`.torch_alloc` (GPU memory)
and :mod:`.capture` (weak-class traffic written for a better draft). Between processes: :mod:`.share` (one
server's API-server processes publishing to each other). :mod:`.measure` drives engines through measured rounds
(calibration, the demo, evaluate).
Imports every layer below (core, verdict, state, export), never :mod:`specscope.read`.
"""
