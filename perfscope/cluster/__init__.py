"""Analysis where the traces are: each rank's task on the machine that wrote its file, only the results
moved (``diagnose --ray``: :mod:`perfscope.cluster.ray_diagnose`; ``trace --analyse-on-host``:
:mod:`perfscope.cluster.onhost`, run by the host's own Python from :mod:`perfscope.cluster.onhost_task`)."""
