"""Discrete-event simulator around the scheduling core: traces, workloads, layouts, engine."""
