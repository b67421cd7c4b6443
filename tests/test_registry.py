"""`evidence.registry`: one record per technique, read by every instrument."""

import dataclasses

import numpy as np
import pytest

from evidence import distributed, exactness, registry
from evidence.benchmarks import report, variants


def test_ids_and_labels_are_unique_and_ids_are_identifiers():
    ids = [t.id for t in registry.TECHNIQUES]
    labels = [t.label for t in registry.TECHNIQUES]
    assert len(set(ids)) == len(ids) and len(set(labels)) == len(labels)
    assert all(i.isidentifier() for i in ids)


def test_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        registry.TECHNIQUES[0].exact = True


def test_every_record_has_a_family_and_a_mask_kind():
    for t in registry.TECHNIQUES:
        assert t.family in registry.FAMILIES
        assert t.mask in registry.MASK_KINDS
    assert {t.family for t in registry.TECHNIQUES} == set(registry.FAMILIES)


def test_every_record_is_used_by_some_instrument():
    for t in registry.TECHNIQUES:
        assert t.setup or t.fit or t.benchmark or t.keras_fit, t.id


@pytest.mark.slow
def test_one_registry_serves_the_keras_level_matrix_without_tensorflow():
    # The matrix of every backend reads the same records, by the same ids.
    import subprocess
    import sys

    code = (
        "import sys; from evidence import backend_matrix, registry\n"
        "assert 'tensorflow' not in sys.modules, 'imported TensorFlow'\n"
        "ids = [t.id for t in registry.TECHNIQUES if t.keras_fit]\n"
        "assert list(backend_matrix.TECHNIQUES) == ids\n"
        "print(ids)"
    )
    env = {"KERAS_BACKEND": "jax", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "partial_dense" in done.stdout and "partial_delta" not in done.stdout


def test_a_fit_form_has_a_setup_for_the_same_masks():
    # distributed.train checks model.fit against the custom loop of `setup`.
    for t in registry.TECHNIQUES:
        if t.fit is not None:
            assert t.setup is not None, t.id


def test_the_reparametrize_family_is_exact():
    assert all(t.exact for t in registry.select(family=registry.REPARAMETRIZE))


def test_get_takes_an_id_or_its_record_and_names_the_ids_otherwise():
    record = registry.get("partial_delta")
    assert registry.get(record) is record
    for bad in ("PartialVariable (delta)", "partial_variable", None, 3):
        with pytest.raises(ValueError, match="partial_delta") as info:
            registry.get(bad)
        assert "`technique`" in str(info.value)
    copy = dataclasses.replace(record, label="a copy")
    with pytest.raises(ValueError, match="record"):
        registry.get(copy)


def test_select_filters_on_attributes_and_refuses_unknown_ones():
    assert registry.select() == registry.TECHNIQUES
    assert registry.select(mask="diagonal") == (registry.get("diagonal_dense"),)
    assert all(t.distributed for t in registry.select(distributed=True))
    with pytest.raises(TypeError, match="colour"):
        registry.select(colour="blue")


def test_bad_records_are_refused():
    with pytest.raises(ValueError, match="family"):
        registry.Technique("x", "x", "magic", True)
    with pytest.raises(ValueError, match="mask"):
        registry.Technique("x", "x", registry.RESTRICT, True, mask="ring")
    with pytest.raises(ValueError, match="id"):
        registry.Technique("not an id", "x", registry.RESTRICT, True)
    with pytest.raises(ValueError, match="density"):
        registry.Benchmark(lambda: None, "structured", "sometimes")


def test_every_instrument_reads_the_registry():
    ids = {t.id for t in registry.TECHNIQUES}
    assert {t.id for t in exactness.TECHNIQUES} <= ids
    assert {t.id for t in distributed.TECHNIQUES} <= ids
    benchmarked = {t.id for t in registry.TECHNIQUES if t.benchmark}
    comparisons = {variants.BASELINE, variants.FLOOR} | {
        t.benchmark.naive for t in registry.TECHNIQUES if t.benchmark
    } - {None}
    assert set(variants.ALL) == benchmarked | comparisons
    assert not comparisons & ids  # a comparison is not a technique
    for names in report.GROUPS.values():
        assert set(names) <= set(variants.ALL)


def test_setups_build_the_weight_they_start_from():
    rng = np.random.default_rng(0)
    init = rng.normal(size=(4, 4)).astype("float32")
    for t in exactness.TECHNIQUES:
        mask = exactness.mask_for(t, rng.random((4, 4)) < 0.5)
        setup = t.setup(init, mask, "float32")
        weight = np.asarray(setup.weight())
        np.testing.assert_array_equal(weight[mask], init[mask], err_msg=t.id)
        if t.mask == "any":  # a structured layer holds zeros outside its mask
            np.testing.assert_array_equal(weight, init, err_msg=t.id)
        np.testing.assert_allclose(
            np.asarray(setup.output(np.eye(4, dtype="float32"))), weight, rtol=1e-6
        )
