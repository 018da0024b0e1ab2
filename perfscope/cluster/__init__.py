"""Analysis where the traces are: each rank's task on the machine that wrote its file, only the results
moved (``diagnose --ray``: :mod:`perfscope.cluster.ray_diagnose`)."""
