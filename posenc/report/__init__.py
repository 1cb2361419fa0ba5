"""Runs on disk compared: tables with intervals, rank intervals and verdicts (`posenc compare`),
the figures of a comparison, and report.md / report.html."""
