"""Sources of telemetry: vLLM's in-process stat logger and server middleware, NVML, torch's allocator.

Each source turns what it reads into specscope's own types and hands them to a :class:`specscope.hub.Hub`;
nothing downstream reads a source directly.
"""
