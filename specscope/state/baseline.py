"""The hub's baseline: the same target's step times without speculation, held for the engine the hub records and
checked against its setup each time the setup is said (:func:`specscope.verdict.baseline.baseline_problem`, the
check every road applies); a misfit is kept, with its reason, and said once in the log."""

from __future__ import annotations

import logging
import threading

from specscope.core.model import EngineSetup, StepProfile
from specscope.verdict.baseline import baseline_problem

log = logging.getLogger("specscope")


class Baseline:
    """The same target's step times without speculation, kept but not used where measured on another setup (model
    architecture, dtype, device, vLLM version, max_num_seqs, ...): ``state`` then says why, and one warning is
    logged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The profile, and why it does not fit the engine's setup (None while it fits); read as one.
        self.state: tuple[StepProfile | None, str | None] = (None, None)

    def set(self, profile: StepProfile | None, setup: EngineSetup | None) -> None:
        """Hold ``profile`` (None: none), checked against ``setup``, the engine's."""
        with self._lock:
            self.state = (profile, None)
        self.check(setup)

    def check(self, setup: EngineSetup | None) -> None:
        """Check the profile against ``setup`` (the engine's, as last set) unless it was found not to fit."""
        with self._lock:
            profile, problem = self.state
            if profile is None or problem is not None:
                return
            problem = baseline_problem(profile, setup)
            if problem is None:
                return
            self.state = (profile, problem)
        log.warning("specscope: baseline not used: %s; run `specscope calibrate` on this setup", problem)
