"""``perfscope trace``: several hosts in parallel (trace.py), one host's trace flow (host.py) and its
steps: where the server is (endpoint.py), a bench without the profiler first (prebench.py), the load
it runs while the profiler records (load.py), the waits for complete traces (wait.py), the copy back
(copyback.py), the cleanup after a failure (cleanup.py); its options (options.py); what differs
between serving engines, one adapter each (engines/). The transport it uses is perfscope.remote,
the load generator perfscope.bench, the run folder perfscope.rundir."""
