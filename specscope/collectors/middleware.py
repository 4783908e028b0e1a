"""``--middleware specscope.collectors.middleware.SpecscopeMiddleware``, as deployments named it before the package
was laid out in layers: the same class as :class:`specscope.engine.middleware.SpecscopeMiddleware`."""

from specscope.engine.middleware import SpecscopeMiddleware

__all__ = ["SpecscopeMiddleware"]
