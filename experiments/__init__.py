"""Experiments that load or run models: the benchmark (``rift-ada bench`` / ``demo``) and its report,
closed-loop confirmation of a calibration, the engine controller, replay fidelity and ``rift-ada evaluate``.

They build on the model-free calibration (:mod:`rift_ada.calibrate`), the policies, the collectors and
the runtime; nothing below this package imports it. Import the modules themselves
(``rift_ada.experiments.bench``, ``rift_ada.experiments.confirm``, ...): this package re-exports nothing.
"""
