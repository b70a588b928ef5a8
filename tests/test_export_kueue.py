"""``jupyter-gpushare export kueue``: every object fits Kueue's own CRD schema (v1beta2, from
Kueue v0.19.2, vendored under tests/data/kueue) and its numbers come from the policy.

No API server and no Kueue controller run here: the objects are checked against the CRDs'
``openAPIV3Schema`` (strict: unknown fields are errors) and the CEL rules that apply to
them, checked by hand in ``kubejobkit``.
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubejobkit import crd_schema, validate_kueue

from jupyter_gpushare.cli import main
from jupyter_gpushare.export.kueue import ENFORCEMENTS, KueueOptions, kueue_objects
from jupyter_gpushare.policy import load_policy

ROOT = Path(__file__).resolve().parent.parent
POLICIES = [
    ROOT / "hub_config" / "gpushare.yaml",
    ROOT / "tests" / "data" / "jobs_policy.yaml",
    ROOT / "tests" / "data" / "lab_policy.yaml",
    ROOT / "tests" / "data" / "kueue_mig_policy.yaml",
]


def by_kind(objs: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def quota(cq: dict, flavor_prefix: str, resource: str, key: str = "nominalQuota") -> object:
    [group] = cq["spec"]["resourceGroups"]
    for fl in group["flavors"]:
        if fl["name"].startswith(flavor_prefix):
            for r in fl["resources"]:
                if r["name"] == resource:
                    return r.get(key)
    raise AssertionError(f"no {resource} in flavor {flavor_prefix}*")


@pytest.mark.parametrize("enforcement", ENFORCEMENTS)
@pytest.mark.parametrize("policy_file", POLICIES, ids=lambda p: p.name)
def test_every_object_fits_the_kueue_crd_schema(policy_file: Path, enforcement: str) -> None:
    policy = load_policy(policy_file)
    opts = KueueOptions(enforcement=enforcement)
    if enforcement == "mig":  # MIG everywhere needs MIG models: give the other pools theirs
        opts = KueueOptions(enforcement="mig", pool_enforcement={
            p.name: "whole" for p in policy.pools if p.mode.value != "mig"})
    objs = kueue_objects(policy, opts)
    kinds = {o["kind"] for o in objs}
    assert kinds == {"Cohort", "ResourceFlavor", "ClusterQueue", "LocalQueue",
                     "WorkloadPriorityClass"}
    for obj in objs:
        validate_kueue(obj)
    assert len(by_kind(objs, "ClusterQueue")) == len(policy.teams)
    assert len(by_kind(objs, "WorkloadPriorityClass")) == len(policy.priority_classes)


def test_the_schema_check_can_fail() -> None:
    """The vendored schema refuses what Kueue would: a typo, a bad enum, a wrong type."""
    objs = kueue_objects(load_policy(POLICIES[0]))
    cq = next(o for o in objs if o["kind"] == "ClusterQueue")
    bad = [
        {**cq, "spec": {**cq["spec"], "cohort": "gpushare"}},  # v1beta1's field name
        {**cq, "spec": {**cq["spec"], "preemption": {"reclaimWithinCohort": "Always"}}},
        {**cq, "spec": {**cq["spec"], "queueingStrategy": 3}},
    ]
    for obj in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(obj, crd_schema("ClusterQueue", "v1beta2"))
    no_cohort = {**cq, "spec": {k: v for k, v in cq["spec"].items() if k != "cohortName"}}
    with pytest.raises(AssertionError, match="borrowingLimit must be nil"):
        validate_kueue(no_cohort)


def test_mig_enforcement_of_a_pool_without_mig_models_is_refused_with_the_pool() -> None:
    policy = load_policy(POLICIES[0])
    with pytest.raises(ValueError, match="pool train .mig.: GPU model 'H200' names no MIG"):
        kueue_objects(policy, KueueOptions(enforcement="mig"))
    with pytest.raises(SystemExit, match="--pool-enforcement"):
        main(["export", "kueue", str(POLICIES[0]), "--enforcement", "mig"])


def test_quotas_are_the_policy_guarantees_and_borrow_limits() -> None:
    objs = kueue_objects(load_policy(POLICIES[0]))
    cqs = by_kind(objs, "ClusterQueue")
    vision, nlp = cqs["gpushare-vision"], cqs["gpushare-nlp"]
    assert quota(vision, "gpushare-train", "nvidia.com/gpu") == 4
    assert quota(vision, "gpushare-train", "nvidia.com/gpu", "borrowingLimit") == 2
    assert quota(nlp, "gpushare-train", "nvidia.com/gpu") == 3
    assert quota(vision, "gpushare-interactive", "nvidia.com/gpu") == "1500m"
    assert quota(vision, "gpushare-debug", "nvidia.com/gpu") == "250m"
    # CPU and memory in proportion: vision holds 4 of the train pool's 8 GPUs (2 nodes of
    # 112 CPUs and 2 TiB), so half of them
    assert quota(vision, "gpushare-train", "cpu") == 112
    assert quota(vision, "gpushare-train", "memory") == f"{2 * 1024 * 1024}Mi"
    # a team without a quota in a pool gets none there (research has no inference quota)
    assert quota(cqs["gpushare-research"], "gpushare-inference", "nvidia.com/gpu") == 0
    for cq in cqs.values():
        assert cq["spec"]["cohortName"] == "gpushare"
        assert cq["spec"]["preemption"] == {
            "reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority",
            "borrowWithinCohort": {"policy": "Never"}}
    # the cohort holds what no team is guaranteed: debug has 1 GPU, guarantees 3 x 1/4
    [cohort] = by_kind(objs, "Cohort").values()
    assert quota(cohort, "gpushare-debug", "nvidia.com/gpu") == "250m"
    assert quota(cohort, "gpushare-train", "nvidia.com/gpu") == 0


def test_a_changed_guarantee_changes_the_nominal_quota(tmp_path: Path) -> None:
    text = POLICIES[0].read_text().replace(
        "train:       {guaranteed: 4,   borrow_limit: 2",
        "train:       {guaranteed: 2.5, borrow_limit: 1", 1)
    changed = tmp_path / "policy.yaml"
    changed.write_text(text)
    vision = by_kind(kueue_objects(load_policy(changed)), "ClusterQueue")["gpushare-vision"]
    assert quota(vision, "gpushare-train", "nvidia.com/gpu") == "2500m"
    assert quota(vision, "gpushare-train", "nvidia.com/gpu", "borrowingLimit") == 1
    # and 1.5 train GPUs are now nobody's: the cohort holds them for borrowing
    [cohort] = by_kind(kueue_objects(load_policy(changed)), "Cohort").values()
    assert quota(cohort, "gpushare-train", "nvidia.com/gpu") == "1500m"


def test_enforcement_resources() -> None:
    policy = load_policy(POLICIES[0])
    hami = by_kind(kueue_objects(policy, KueueOptions(enforcement="hami")), "ClusterQueue")
    vision = hami["gpushare-vision"]
    assert vision["spec"]["resourceGroups"][0]["coveredResources"] == [
        "cpu", "memory", "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"]
    assert quota(vision, "gpushare-train", "nvidia.com/gpucores") == 400
    assert quota(vision, "gpushare-train", "nvidia.com/gpumem") == 4 * 141 * 1024
    assert quota(vision, "gpushare-train", "nvidia.com/gpu") == 40  # 10 vGPUs per card
    ts = by_kind(kueue_objects(policy, KueueOptions(enforcement="timeslice",
                                                    timeslice_replicas=8)), "ClusterQueue")
    assert quota(ts["gpushare-vision"], "gpushare-interactive", "nvidia.com/gpu.shared") == 12
    amd = by_kind(kueue_objects(policy, KueueOptions(gpu_resource="amd.com/gpu")),
                  "ClusterQueue")
    assert quota(amd["gpushare-nlp"], "gpushare-train", "amd.com/gpu") == 3


def test_mig_profiles_and_models_get_their_own_flavors() -> None:
    objs = kueue_objects(load_policy(POLICIES[3]), KueueOptions(product_label=None))
    flavors = by_kind(objs, "ResourceFlavor")
    # 'H100 1g.10gb' had to change more than its case: a hash keeps such names apart
    assert {n.rsplit("-", 1)[0] if "slices" in n else n for n in flavors} == {
        "gpushare-train-h100", "gpushare-train-a100",
        "gpushare-slices-h100-1g-10gb", "gpushare-slices-h100-3g-40gb"}
    assert flavors["gpushare-train-h100"]["spec"]["nodeLabels"] == {
        "gpushare.jupyter.org/pool": "train"}
    speech = by_kind(objs, "ClusterQueue")["gpushare-speech-team-" + next(
        n.rsplit("-", 1)[1] for n in by_kind(objs, "ClusterQueue") if "speech" in n)]
    # 6 of the train pool's 8 GPUs, split in proportion over its two models (4 + 4)
    assert quota(speech, "gpushare-train-h100", "nvidia.com/gpu") == 3
    assert quota(speech, "gpushare-train-a100", "nvidia.com/gpu") == 3
    # 1 GPU unit of MIG, split by the flavors' units: 7 x 143 milli of 1g devices and
    # 2 x 429 of 3g: 1000*1001//1859 = 538 milli = 3.762 1g devices; 461 = 1.074 3g devices
    one_g = quota(speech, "gpushare-slices-h100-1g", "nvidia.com/mig-1g.10gb")
    three_g = quota(speech, "gpushare-slices-h100-3g", "nvidia.com/mig-3g.40gb")
    assert one_g == "3762m" and three_g == "1074m"
    assert quota(speech, "gpushare-train-h100", "nvidia.com/mig-1g.10gb") == 0
    wpc = by_kind(objs, "WorkloadPriorityClass")
    # non-preemptible 'planned' shares the top value, above the preemptible 'urgent'
    assert wpc["gpushare-planned"]["value"] == 2001
    assert wpc["gpushare-urgent"]["value"] == 2000
    assert wpc["gpushare-batch"]["value"] == 10
    labelled = kueue_objects(load_policy(POLICIES[3]),
                             KueueOptions(product_label="nvidia.com/gpu.product"))
    assert by_kind(labelled, "ResourceFlavor")["gpushare-train-a100"]["spec"]["nodeLabels"][
        "nvidia.com/gpu.product"] == "A100"


def test_the_command_writes_a_yaml_stream_kubectl_can_apply(tmp_path: Path) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["export", "kueue", str(POLICIES[0]), "--namespace", "ml-jobs",
                     "--enforcement", "hami"])
    assert code == 0
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    assert len(docs) == 14
    for doc in docs:
        validate_kueue(doc)
    lqs = [d for d in docs if d["kind"] == "LocalQueue"]
    assert {d["metadata"]["namespace"] for d in lqs} == {"ml-jobs"}
    cq = next(d for d in docs if d["kind"] == "ClusterQueue")
    assert cq["spec"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "ml-jobs"}
    target = tmp_path / "kueue.yaml"
    assert main(["export", "kueue", str(POLICIES[1]), "-o", str(target)]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(target.read_text()) if d][-1] == "LocalQueue"
