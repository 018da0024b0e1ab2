"""``perfscope trace``: the trace flow per host (trace.py), its options (options.py), the load it
runs while the profiler records (load.py) and its waits for complete traces (wait.py). The transport
it uses is perfscope.remote, the load generator perfscope.bench, the run folder perfscope.rundir."""
