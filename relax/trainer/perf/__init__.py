"""Performance accounting: the step's metrics row, model FLOPs and the machine's limits they are divided by (docs/performance.md)."""
