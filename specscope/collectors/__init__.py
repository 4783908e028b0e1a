"""The old home of the engine's collectors (now :mod:`specscope.engine`), kept only so that a deployment started
with ``vllm serve --middleware specscope.collectors.middleware.SpecscopeMiddleware`` keeps working."""
