"""Renderers: one per output format, each reads a Diagnosis (plain data) and nothing else."""
