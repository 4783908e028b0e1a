"""``specscope evaluate``: which draft, and which K, measured before deploying.

Each candidate (a draft model, an EAGLE-3 or EAGLE-1 head, the target's own MTP layers, or n-gram lookup) runs at
each K beside the target without speculation: the two engines take the same prompts with the batch held full at each
batch size (:func:`~specscope.engine.measure.steady_throughput`: greedy, each request's ``max_tokens`` generated),
alternating which goes first, and the speedup at a batch size is the median of the rounds' ratios, with their
spread. One speculative engine is alive at a time beside the plain one. For each candidate: a draft's tokenizer
verdict (a mismatch is refused unless forced; heads run with the target's), acceptance overall, by draft position
and by traffic class, the draft's cost in KV capacity, specscope's predicted speedup (its estimate from the run,
against the plain engine's step times measured right after it) beside the measured one, and the best K at each batch
size (K = 0: remove ``speculative_config``). From those comes vLLM's ``num_speculative_tokens_per_batch_size``
schedule, by the live verdict's rule, which is run as configured and measured too: a K = 0 range in it is not plain
speed (a draft model or head still runs a pass a step), so it is chosen only where it beats every K at the price
specscope's estimate puts on it.

The rooms:

- :mod:`~specscope.read.workload` (shared with ``specscope calibrate`` and the demo): the prompts file (JSON lines or
  ShareGPT) and the tokenized workload.
- :mod:`~specscope.read.evaluate.results`: what was measured (Candidate, KRun, Cell, Schedule, Evaluation).
- :mod:`~specscope.read.evaluate.choose`: the schedule from the measured speedups, and the ranking of candidates.
- :mod:`~specscope.read.evaluate.gate`: ``--gate``, the promotion gate: a candidate draft against the incumbent,
  class by class on the same prompts, promoted, held or rejected, and why; its statistics in
  :mod:`~specscope.read.evaluate.stats`, its JSON, summary and page in :mod:`~specscope.read.evaluate.gate_report`.
- :mod:`~specscope.read.evaluate.runner`: the engines, started, measured and stopped.
- :mod:`~specscope.read.evaluate.render`: JSON, the terminal summary and the HTML page.
- :mod:`~specscope.read.evaluate.cli`: the command's arguments and its run.
"""

from specscope.read.evaluate.cli import add_arguments, main

__all__ = ["add_arguments", "main"]
