# Owns the Python name of the view resolution: which view a client reads in (issue 27,
# docs/views.md). The rule is the Rust client's (client/src/view.rs), called through the native
# module, so that Python and Rust ranks of one job always agree.
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

from tunecache import _native

VIEW_ENV = "TUNECACHE_VIEW"


def resolve_view(environ=None, explicit=None) -> str:
    """The view for a process with environment ``environ`` (a mapping; default: ``os.environ``),
    with ``explicit`` as the last resort; the empty string for no view."""
    return _native.resolve_view(os.environ if environ is None else environ, explicit)
