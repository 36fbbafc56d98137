"""A fixed set of kills, every stage once plus one with the cache on the GCS emulator: each kills a run,
checks that nothing partial counts as done, reruns it and compares with one undisturbed reference run
shared by the module (tests/faults/harness.py), each case on a cache holding the reference's commits upstream
of the stage it kills. About 100 s on 2 cores.

    python -m pytest -q -p no:cacheprovider tests/faults
    make faults N=200                    # the seeded version: many kills, a table, benchmarks/out/faults.json

The delays are deterministic per case: a fixed window and `random.Random(seed)` (the result in comments).
"""

import pytest

from tests.faults.harness import Case, Harness

FIXED = [
    Case("download", "commit", seed=0),
    Case("clean", "random", seed=1, window_s=1.0),         # 0.13 s into clean's Beam pipeline (about 1 s)
    # 0.023 s into sentencepiece's training (about 0.05 s), counted from "training a bpe tokenizer"
    Case("tokenizer", "random", seed=9, after=r"training a \w+ tokenizer", window_s=0.05),
    Case("shard", "commit", seed=3),
    # 0.07 s after the step-6 checkpoint began (Orbax saves asynchronously): mid-checkpoint, with step 3's
    # checkpoint complete to resume from
    Case("train", "random", seed=4, after=r"checkpoint step 6 ->", window_s=0.3),
    Case("train", "commit", seed=10),    # every step done and saved in work/: the rerun resumes at the end
    Case("evaluate", "commit", seed=5),
    Case("shard", "gcs", seed=7, window_s=0.4),            # 0.13 s into shard's uploads (about 0.4 s)
]

@pytest.fixture(scope="module")
def harness(tmp_path_factory, tiny_run):
    return Harness(str(tmp_path_factory.mktemp("faults")), shared=tiny_run)


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.gcs] if c.point == "gcs" else [],
                                               id=f"{c.stage}-{c.point}") for c in FIXED])
def test_a_killed_stage_reruns_to_the_undisturbed_outputs(harness, case, request):
    if case.point == "gcs":
        harness.gcs_root = request.getfixturevalue("gcs_bucket")
    r = harness.run(case)
    logs = f"(logs: {r.log_dir})"
    assert r.killed and r.landed == case.stage, f"the run was not killed inside {case.stage} {logs}"
    assert r.partial, f"the kill came after {case.stage} had committed: move the case's delay {logs}"
    assert r.done_but_partial == [], logs
    assert r.status_disagrees == [], logs
    assert r.rerun_ok, logs
    assert r.records_lost in (0, None), logs
    assert r.leftovers == [], logs
    if case.stage == "train":
        assert r.resumed_from is not None and r.resumed_from >= 3, logs
    # Training resumes on the same logging grid and, resumed at its last step, summarizes from the rows
    # logged before (both found by this harness): its metrics and summary equal the undisturbed run's.
    assert r.differences == [], logs


def test_the_seeded_cases_cover_every_stage_and_kill_point():
    """`make faults`' default N covers every (stage, kill point) pair once, and any 3 rounds of stages do
    too; each stage meets every point (a campaign of 200 once killed each stage at one point only)."""
    from tests.faults import harness

    first = [harness.seeded_case(seed) for seed in range(harness.CASES_PER_ROUND)]
    pairs = {(c.stage, c.point) for c in first}
    assert len(pairs) == len(harness.STAGES) * len(harness.POINTS) == len(first)
    for stage in harness.STAGES:
        points = {case.point for case in map(harness.seeded_case, range(200)) if case.stage == stage}
        assert points == set(harness.POINTS), stage
