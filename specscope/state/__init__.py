"""The live store of one process: the hub and what it keeps, above :mod:`specscope.core` and
:mod:`specscope.verdict`.

The rooms: :mod:`.hub` (the one object collectors write to and consumers read a snapshot from), :mod:`.streams`
(each engine's step counts), :mod:`.request_log` and :mod:`.request_store` (finished requests, bounded),
:mod:`.background` (the hub's threads: flushers, listeners, the GPU poller) and :mod:`.merge` (snapshots of several
engines or processes added into one).
"""
