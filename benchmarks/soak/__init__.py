"""The soak harness's parts (issue 28): ``benchmarks/soak.py`` drives them.

* :mod:`.history`: what happened, as one JSON document (events, the database rows read
  directly at the end, the hub's snapshots, the backends' files), saved and loaded for replay;
* :mod:`.audit` and :mod:`.audit_jobs`: pure checks of a history against the invariants,
  never through the broker's own bookkeeping (its API's figures are only compared);
* :mod:`.stack`: the real hub, its proxy, the broker under its supervisor, single-user
  servers (simulated GPUs) and the local batch backend, restartable;
* :mod:`.faults`: the seeded fault schedule and the injector;
* :mod:`.drivers`: simulated users of five teams and the snapshotter;
* :mod:`.prober` (and :mod:`.probe_child`, its process): admission asked for every second,
  the way the spawner asks, timed outside the harness's threads;
* :mod:`.summary`: the printed summary, ending with ``violations: N``.
"""
