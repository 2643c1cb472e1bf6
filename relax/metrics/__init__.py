"""Metrics: one namespaced vocabulary (``rollout/``, ``train/``, ``perf/``), reduced across
ranks in one place (:class:`MetricTracker`) and written by rank 0 (:class:`MetricsLogger`)."""

from relax.metrics.sinks import (
    ConsoleSink,
    JsonlSink,
    MetricsLogger,
    TensorBoardSink,
    build_logger,
    summary_line,
)
from relax.metrics.tracker import MetricTracker

__all__ = [
    "ConsoleSink",
    "JsonlSink",
    "MetricTracker",
    "MetricsLogger",
    "TensorBoardSink",
    "build_logger",
    "summary_line",
]
