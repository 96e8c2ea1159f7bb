"""The serving benchmark client: workloads, trace replay, and `vllm bench serve`'s metrics.

from phalanx.serve.bench import BenchConfig, WorkloadSpec, run
result = run(BenchConfig(url="http://127.0.0.1:8080", model="m",
                         workload=WorkloadSpec(name="mooncake", num=200, scale=0.02,
                                               trace_time=True, time_scale=0.5)))
print(result.to_json())
"""

from phalanx.serve.bench.client import BenchConfig, Result, run, run_async
from phalanx.serve.bench.metrics import Goodput, Metrics, RequestRecord, calculate_metrics
from phalanx.serve.bench.workloads import BenchRequest, WorkloadSpec, build

__all__ = [
    "BenchConfig",
    "BenchRequest",
    "Goodput",
    "Metrics",
    "RequestRecord",
    "Result",
    "WorkloadSpec",
    "build",
    "calculate_metrics",
    "run",
    "run_async",
]
