"""Upper bounds of the size flags (``--pp``, ``-m``, ``--jobs``, batch sizes).

Far above any real pipeline, low enough that a typo cannot ask for gigabytes or hours: the
analysis, the simulator and the what-if tables allocate per stage and per micro-batch.
"""

from __future__ import annotations

MAX_PP = 4096  # pipeline stages (and tensor / context parallel sizes)
MAX_MICROBATCHES = 4096  # micro-batches per step
MAX_VIRTUAL = 64  # model chunks per rank
MAX_JOBS = 1024  # parse processes
MAX_SAMPLES = 2**40  # batch sizes in samples
# the simulator's work grows with stages x micro-batches x chunks (P x M x v = 32768 takes a few
# seconds): larger tables are not simulated
MAX_SIM_CELLS = 1 << 15
