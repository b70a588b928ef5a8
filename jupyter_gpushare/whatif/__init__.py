"""What if: replay a month of recorded demand under a proposed policy or more cards.

* :mod:`.demand`: the demand model (one record per server or job);
* :mod:`.replay`: the pure simulator (the core's admission, placement, preemption and
  queueing, driven as the broker drives them, in simulated time);
* :mod:`.history`: recorded rows to demands; :mod:`.records`: reading them (read-only);
* :mod:`.inventory`: cards added to a policy (``--add POOL:MODEL:COUNT``);
* :mod:`.compare`: figures per team and pool (granted, measured and idle GPU-hours, the
  guarantee met on demand), side by side; :mod:`.fidelity`: replay
  against the record; :mod:`.render`: Markdown, JSON and HTML;
* :mod:`.study`: one what-if (both replays, side by side); :mod:`.advice`: the report's
  "buy" / "move" checked by a replay;
* sources without history: :mod:`.synth` (a generated month), :mod:`.alibaba` (the
  Alibaba GPU trace), :mod:`.plannerinput` (the planner's team inputs);
* :mod:`.command`: ``jupyter-gpushare whatif``.

See ``docs/whatif.md``.
"""
