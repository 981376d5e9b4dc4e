"""What a change would buy: predicted step time, bubble, lost time by cause and memory of a scenario.

A scenario changes some of: the number of micro-batches ``M``, the schedule, the virtual stages per
rank ``v``, the pipeline size ``P``, the split of the model into stages (``rebalance``), and removes
measured delays (``no_comm_wait``, ``no_host``). Predictions come from the schedule simulator
(:mod:`ppdiag.simulate`) driven by what the run measured:

* per-stage forward / backward / weight-gradient costs of one micro-batch (:class:`MeasuredRun`);
* the normal p2p latency between stages (the median transfer the analysis saw);
* what every rank does before its first block and after its last one (optimizer, step-end
  collectives);
* everything else the run lost (host and launch overhead, slow transfers, unexplained waits) through
  a **calibration**: the simulator's prediction of the *measured* configuration is compared with the
  measured step time and the difference is carried over to every scenario, by default as an
  overhead added to every block (``per-block``: host/launch work and late transfers happen per
  micro-batch and travel along the pipeline's critical path, so they grow with M and with the
  number of chunks); ``per-step`` (one constant per step), ``ratio`` (a factor) and ``none`` (the
  simulator alone) are the alternatives. Removing a cause lowers the calibration target by the step
  time the analysis' replay says that cause costs.

Changing M at a fixed global batch changes the micro-batch size: per-micro-batch compute scales by
``M_old / M_new`` (compute assumed linear in the micro-batch size — optimistic for small
micro-batches on GPUs), while the per-block overhead and the p2p latency stay. With
``fixed_microbatch_size`` costs stay and a step processes more samples: the speed-up is then the
throughput ratio (time per sample), not the step-time ratio.

Memory: the peak number of micro-batches a rank holds activations for, from the simulated block
order (forward done minus backward done, max over time, summed over its chunks), weighted by each
chunk's share of the model and by the micro-batch size, relative to the measured configuration.

The pieces: :mod:`ppdiag.whatif.types` (scenario, options, prediction), :mod:`ppdiag.whatif.costs`
(what the run measured), :mod:`ppdiag.whatif.calibration`, :mod:`ppdiag.whatif.memory`,
:mod:`ppdiag.whatif.model` (the simulation of a scenario) and :mod:`ppdiag.whatif.fixes` (the
predictions of every fix a finding can name). This module is their one public face.
"""

from __future__ import annotations

from ppdiag.whatif.calibration import Calibration
from ppdiag.whatif.fixes import (
    FIX_LABELS,
    FixPredictions,
    default_keys,
    default_scenarios,
    fix_scenarios,
    predict_fixes,
    report_rows,
)
from ppdiag.whatif.memory import rank_peaks
from ppdiag.whatif.model import WhatifModel, build_model, model_of
from ppdiag.whatif.types import CALIBRATIONS, Prediction, Scenario, WhatifOptions, describe

__all__ = [
    "CALIBRATIONS",
    "FIX_LABELS",
    "Calibration",
    "FixPredictions",
    "Prediction",
    "Scenario",
    "WhatifModel",
    "WhatifOptions",
    "build_model",
    "default_keys",
    "default_scenarios",
    "describe",
    "fix_scenarios",
    "model_of",
    "predict_fixes",
    "rank_peaks",
    "report_rows",
]
