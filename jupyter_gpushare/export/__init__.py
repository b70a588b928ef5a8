"""The policy as other engines' configuration: Kueue objects (:mod:`.kueue`) and Slurm
configuration with ``sacctmgr`` commands (:mod:`.slurm`). Pure: each exporter turns a loaded
:class:`~jupyter_gpushare.core.model.Policy` into text; ``jupyter-gpushare export`` writes it."""
