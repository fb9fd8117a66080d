# Owns which view a Python client reads in: the name of the job whose ranks must all see the same
# result for a key (issue 27, docs/views.md), resolved from the environment in the same order as
# the Rust client (client/src/view.rs), so that ranks need no code change.
"""The view a client reads in, from the environment.

The daemon pins the first answer for a key within a view; every later read of that key in the
view gets the same result. The first source that is set wins:

1. ``TUNECACHE_VIEW``, as it is; set but empty turns views off, whatever follows;
2. Slurm: ``slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>``, or ``slurm-<SLURM_JOB_ID>`` outside a step;
3. torchrun: ``torchelastic-<TORCHELASTIC_RUN_ID>``, unless the id is torchrun's default
   ``none`` (its ``--rdzv-id`` default), which every run without ``--rdzv-id`` shares;
4. the explicit name given to ``Client(view=...)``.

The launchers' variables come before the explicit name so that one job's ranks agree even if
some of them were given another name.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

VIEW_ENV = "TUNECACHE_VIEW"
SLURM_JOB_ID_ENV = "SLURM_JOB_ID"
SLURM_STEP_ID_ENV = "SLURM_STEP_ID"
TORCHELASTIC_RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
# torchrun's --rdzv-id when none is given: shared by unrelated runs, so it names no job.
_TORCHRUN_DEFAULT_RUN_ID = "none"


def resolve_view(environ: Optional[Mapping[str, str]] = None, explicit: Optional[str] = None) -> str:
    """The view for a process with environment ``environ`` (default: ``os.environ``), with
    ``explicit`` as the last resort; the empty string for no view."""
    environ = os.environ if environ is None else environ
    if VIEW_ENV in environ:
        return environ[VIEW_ENV]
    # A launcher's variable set but empty names nothing; the next source decides.
    job = environ.get(SLURM_JOB_ID_ENV, "")
    if job:
        step = environ.get(SLURM_STEP_ID_ENV, "")
        return f"slurm-{job}.{step}" if step else f"slurm-{job}"
    run = environ.get(TORCHELASTIC_RUN_ID_ENV, "")
    if run and run != _TORCHRUN_DEFAULT_RUN_ID:
        return f"torchelastic-{run}"
    return explicit or ""
