"""Metrics: one namespaced vocabulary (``rollout/``, ``train/``, ``perf/``), reduced across
ranks in one place (:class:`relax.metrics.tracker.MetricTracker`, which needs torch) and written
by rank 0 (:class:`relax.metrics.sinks.MetricsLogger`, torch-free like ``relax plot``, which
reads what it writes)."""
