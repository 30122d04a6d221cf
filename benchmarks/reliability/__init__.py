"""Reliability harness: a real mesh in child processes, load, faults and measurements.

* :mod:`benchmarks.reliability.mesh` starts the mesh the way ``llmesh up`` lays it
  out (same plan, ports and environment) on a free port offset with a Redis of
  its own, and kills, pauses, drains and restarts single services.
* :mod:`benchmarks.reliability.redis_ha` runs that Redis: one redis-server, or a
  primary, replicas and sentinels whose primary can be killed (also used by
  tests/reliability/test_redis_failover.py); :mod:`benchmarks.reliability.processes`
  keeps every child's process group so that none outlives the harness.
* :mod:`benchmarks.reliability.load` drives streaming chat completions through the
  gateway's HTTP API and records one outcome per request.
* :mod:`benchmarks.reliability.probes` samples every service process (RSS, file
  descriptors, TCP connections, asyncio tasks) over time.
* :mod:`benchmarks.reliability.scenarios` combines them: soak, faults, rolling upgrade.

``llmesh bench soak``, ``llmesh bench faults`` and ``llmesh bench upgrade`` run the
scenarios; ``tests/reliability`` runs them in short form under ``pytest -m soak``.
"""
