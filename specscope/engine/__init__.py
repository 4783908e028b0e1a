"""Everything that runs inside vLLM's processes, and the doors into them.

Doors: :mod:`.wrapper` (``specscope.LLM`` / ``AsyncLLM``), :mod:`.vllm_logger` (the stat-logger plugin for
``vllm serve``), :mod:`.plugin` (vLLM's general-plugin entry point, loaded in every process), :mod:`.instrumentation`
(the OpenTelemetry instrumentor) and :mod:`.middleware` (the ASGI middleware on vLLM's API server). Collectors:
:mod:`.vllm_config` and :mod:`.vllm_stats` (vLLM's config and stats read into the model), :mod:`.vllm_hook`
(per-request hooks), :mod:`.vllm_engine` (an engine's hub and its start-up checks), :mod:`.forward_timer` (the
target's forward, timed where it runs), :mod:`.gpu_source` with :mod:`.nvml` and :mod:`.torch_alloc` (GPU memory)
and :mod:`.capture` (weak-class traffic written for a better draft). Between processes: :mod:`.share` (one
server's API-server processes publishing to each other). :mod:`.measure` drives engines through measured rounds
(calibration, the demo, evaluate).
Imports every layer below (core, verdict, state, export), never :mod:`specscope.read`.
"""
