"""The bottom layer: the telemetry model every other layer speaks, and the arithmetic and primitives on it.

Imports nothing of specscope above it. The rooms: :mod:`.model` (the snapshot's dataclasses), :mod:`.codec` (the
snapshot to and from JSON), :mod:`.counts` (engine steps counted by the second), :mod:`.intervals` (windowed rates
and their intervals), :mod:`.acceptance` (acceptance by draft position), :mod:`.classes` (traffic-class names),
:mod:`.sizing` (parameter counts and KV bytes from configs), :mod:`.memory` (the draft's cost in KV capacity),
:mod:`.health` (what went wrong, counted), :mod:`.tokenizer_check` (draft and target tokenizers compared),
:mod:`.private` (files only we can read) and :mod:`.auth` (the API-key policy, server and client side).
"""
