"""The step-time baseline a hub holds, and whether it was measured on the setup the engine runs."""

from __future__ import annotations

import logging
import threading

from specscope.model import EngineSetup, StepProfile

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
        from specscope.diagnostics import baseline_problem

        with self._lock:
            profile, problem = self.state
            if profile is None or problem is not None:
                return
            problem = baseline_problem(profile, setup)
            if problem is None:
                return
            self.state = (profile, problem)
        log.warning("specscope: baseline not used: %s; run `specscope calibrate` on this setup", problem)
