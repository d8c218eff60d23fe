"""``scripts/bench_perfmodel.py``'s parts, one module per tool: :mod:`.scenarios` (the
scenarios, arms, and what is kept of a run), :mod:`.oracle` (oracle search, then the arms
against it), :mod:`.churn` (re-plans on noise), :mod:`.breakdown` (where a step's time goes)
and :mod:`.ceiling` (efficiency's ceiling). Every runner takes ``launch``
(:func:`bench.launch.train` by default) so it can be exercised without MPI."""
