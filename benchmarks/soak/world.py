"""The simulated site of a soak run: five teams sharing interactive, training and debug GPUs
(simulated H200s), their profiles and the short grace periods that keep preemptions quick."""

from __future__ import annotations

TEAMS = ("vision", "nlp", "speech", "robotics", "recsys")
OWNERS = ("vision", "nlp")  # the teams guaranteed a training GPU; the others borrow

POLICY = """
inventory:
  source: simulated
  simulated:
    - {name: lab, pool: interactive, nodes: 1, gpus_per_node: 2, model: H200,
       gpu_memory: 80GiB, cpu: 64, memory: 512GiB}
    - {name: train, pool: train, nodes: 1, gpus_per_node: 2, model: H200,
       gpu_memory: 141GiB, cpu: 64, memory: 512GiB}
    - {name: dbg, pool: debug, nodes: 1, gpus_per_node: 1, model: H200,
       gpu_memory: 80GiB, cpu: 16, memory: 64GiB}
pools:
  interactive: {mode: shared}
  train: {mode: exclusive}
  debug: {mode: debug}
priority_classes:
  training: {value: 1000, preemptible: false, grace_period: 2s}
  interactive: {value: 500, preemptible: false, grace_period: 2s}
  research: {value: 100, preemptible: true, grace_period: 3s,
             checkpoint_required_after: 10m}
teams:
"""
for _team in TEAMS:
    _train = (
        "{guaranteed: 1, borrow_limit: 1}"
        if _team in OWNERS
        else "{guaranteed: 0, borrow_limit: 1}"
    )
    POLICY += f"""  {_team}:
    groups: [{_team}]
    quotas:
      interactive: {{guaranteed: 1/4, borrow_limit: 1/2, per_user_cap: 1/2}}
      train: {_train}
      debug: {{guaranteed: 1/8, borrow_limit: 1/8}}
"""
POLICY += """  ops:
    groups: [ops]
    quotas:
      debug: {guaranteed: 1/8}
profiles:
  - {slug: debug-eighth, display_name: Debug 1/8 GPU, pool: debug, gpu: {fraction: 1/8},
     cpu: 1, memory: 1GiB, max_lifetime: 30m}
  - {slug: quarter, display_name: Inference dev 1/4 GPU, pool: interactive,
     gpu: {fraction: 1/4}, cpu: 1, memory: 1GiB}
  - {slug: half, display_name: Half GPU, pool: interactive, gpu: {fraction: 1/2},
     cpu: 1, memory: 1GiB}
  - {slug: train-1, display_name: Train 1 GPU, pool: train, gpu: {count: 1},
     priority: training, cpu: 1, memory: 1GiB}
  - {slug: cpu-only, display_name: CPU only, cpu: 1, memory: 1GiB}
  - {slug: job-1gpu, display_name: Job on 1 GPU, pool: train, gpu: {count: 1},
     priority: research, max_lifetime: 1h}
  - {slug: job-quarter, display_name: Job on 1/4 GPU, pool: interactive,
     gpu: {fraction: 1/4}, priority: research, max_lifetime: 1h}
"""

SLURM_NODES = ("lab-0", "train-0")  # the nodes jobs run on: a --slurm run's Slurm nodes

BROKEN = "teams: [this is not closed\n"  # a policy file with an error, for a while

# what users start, with weights (a server holds it until they stop it)
SERVER_PROFILES = (
    ("quarter", 4),
    ("half", 2),
    ("debug-eighth", 3),
    ("cpu-only", 2),
    ("train-1", 2),
)


PROBE = ("probe", "ops")  # the admission prober's user and team


def users(per_team: int) -> dict[str, str]:
    """user -> team."""
    return {f"{team}{i}": team for team in TEAMS for i in range(1, per_team + 1)}
