"""The step after a fix, replayed on the CPU launch timeline: a step cannot finish before its last launch.

Subtracting a kernel's time from the step is right only when the GPU was the bottleneck all
along. Long kernels hide the CPU: while a 0.8 ms cast runs, the CPU launches the next kernels
ahead, and once the cast is gone the GPU waits on those launches again (eager decode on the H200
trace: "step minus casts" said 7.0 ms, 9.8 ms was measured). So every kernel-level prediction is
replayed here:

- each kernel starts at ``max(its launch + launch latency, the end of the previous kernel on its
  stream)`` and runs for its new duration (0 when the fix removes it); kernels of one CUDA-graph
  launch keep their original spacing inside the graph;
- launches keep their recorded CPU times (the lower bound: the CPU still issues them), except
  that a host wait (a synchronize, or a copy to the host that waited for the GPU) ends earlier
  when the GPU work it waited for ends earlier, and every later launch of that thread moves with it;
- the predicted step is the measured step minus what the replay saves (model with the new
  durations vs the model with the recorded ones), so the model's own error cancels;
- the host: from one step's start to the next, the launching thread's time not spent blocked on the
  GPU (synchronizes, copies to the host that waited for their data) is the scheduler, input
  preparation, launches and result processing, which a GPU-side fix does not remove (less the CPU
  time of torch ops whose kernels all go): ``host_floor_ms`` (median), ``host_busy_quick_ms`` (the
  quickest tenth of the steps). Both are the profiled host's; ``perfscope.analysis.hosttime`` turns
  them into the unprofiled host's time, and the prediction is the larger of the GPU side and that
  (``rules.model_prediction``). With CUDA graphs and the overlap scheduler the CPU runs ahead of a
  slow GPU, so the replay alone sees no host cost.

Cross-stream waits (cudaStreamWaitEvent) are followed: a kernel that started later than its launch
and its stream allow waits in the replay for the kernel its event marked, paired on the CPU (the
cudaEventRecord before the wait, the thread's last launch on another stream before that), else read
off the GPU timeline (a kernel on another stream ended just before it started), else for another
stream's kernel whose SMs it waited for (``waits.cross_stream_waits``). NCCL on its own stream
waiting for the compute that filled its buffer, the compute waiting for the collective: a faster
collective or a shorter producer moves the other stream. Any other delay neither explains is kept.
SM sharing between concurrent kernels on two streams (their durations inflate together) is not.

The package, one job a module: ``index`` (a trace's runtime calls and torch ops sorted for per-step
windows), ``waits`` (the cross-stream and in-graph waits a replay follows), ``replay`` (one step
replayed with new durations), ``host`` (the launching thread's own time per step), ``memo`` (the
indexes, baseline replays and host times built once per trace), ``predict`` (the step after a fix).
"""

from perfscope.analysis.stepmodel.host import host_busy, host_wait_us
from perfscope.analysis.stepmodel.index import TraceIndex
from perfscope.analysis.stepmodel.memo import host_busy_of
from perfscope.analysis.stepmodel.predict import predict_after, predict_after_serial
from perfscope.analysis.stepmodel.replay import StepReplay

__all__ = [
    "StepReplay",
    "TraceIndex",
    "host_busy",
    "host_busy_of",
    "host_wait_us",
    "predict_after",
    "predict_after_serial",
]
