"""``perfscope diagnose --ray [ADDRESS]``: each rank's analysis runs on the Ray node that holds its trace
file; only the results (~100 KB a rank) travel to this machine, which reduces them.

1. Survey: one small task pinned to every live node with a CPU finds the trace files under the given
   paths *on that node* (:func:`perfscope.load.discover.discover` there): each file's size and a
   fingerprint (size and a hash of its first and last MiB), the run folder's run.json.
2. Place: each file goes to a node that holds it. A file the run folder lists under a host
   (``files[].host`` of run.json) goes to that host's node (a node labelled ``perfscope-host=HOST``,
   else the node whose hostname or IP is the host's) and only there; any other file to one of the
   nodes that hold the same bytes at that path (one node for node-local folders; on a shared file
   system, the least loaded), spread over the nodes.
3. Map: :func:`perfscope.analysis.split.rank_task` per file, pinned by ``NodeAffinitySchedulingStrategy``
   (hard), one CPU each and the memory its parse peaks at, so a node parses only what fits.
   Results stream back as they finish.
4. Reduce: :func:`perfscope.analysis.split.reduce` on the results only, here: the same diagnosis as
   ``diagnose`` of the same files on one machine.

A node that dies (or whose task's worker dies) costs its pending ranks one retry each on another
node holding the same file; a rank with no such node is reported missing in one line and the others
are diagnosed. The loop checks the nodes' liveness while it waits: it never hangs on a dead node.
A rank file missing on its node, or a trace it cannot read, stops the run as locally (one line,
exit 2).

The package, one job a module: ``tasks`` (what runs in the Ray workers), ``nodes`` (joining the
cluster, its live nodes, waiting for tasks that may be lost with their node), ``place`` (the survey
and each file's node), ``run`` (the rank tasks submitted, retried and reduced)."""

from perfscope.cluster.ray_diagnose.nodes import HOST_LABEL, INSTALL, Node, alive_nodes, connect, import_ray
from perfscope.cluster.ray_diagnose.place import Job, Survey, nodes_of_host, plan
from perfscope.cluster.ray_diagnose.run import RayRun, diagnose_on_ray
from perfscope.cluster.ray_diagnose.tasks import analyse, host_timing, survey

__all__ = [
    "HOST_LABEL",
    "INSTALL",
    "Job",
    "Node",
    "RayRun",
    "Survey",
    "alive_nodes",
    "analyse",
    "connect",
    "diagnose_on_ray",
    "host_timing",
    "import_ray",
    "nodes_of_host",
    "plan",
    "survey",
]
