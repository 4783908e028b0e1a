"""``specscope evaluate``: which draft, and which K, measured before deploying. Moved here whole as
:mod:`specscope.evaluate.render`, so that its history follows; split into rooms next."""

from specscope.evaluate.render import InputError, add_arguments, load_prompts, main, prepare

__all__ = ["InputError", "add_arguments", "load_prompts", "main", "prepare"]
