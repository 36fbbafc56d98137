"""`sweep.*` and `mixsearch.*` (pipeline/search_bindings.py): frozen dataclasses that refuse a bad value
naming it and what would be valid, built from gin like every stage's Config (the gin files named too), and
the shipped sweep and mixture search files still read as they are.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_search_bindings.py
"""

import dataclasses
import glob
import os

import pytest

from pipeline import config, mixsearch, mixture_fit, sweep
from pipeline.search_bindings import MAX_SEEDS, MixSearch, Sweep, proxies_needed
from tests.conftest import REPO

ONE = {"a": ["train.Config.steps = 2"]}


@pytest.mark.parametrize("cls, values, expect", [
    (Sweep, {}, 'variants=() must be a non-empty dict name -> [bindings]; bind sweep.variants = {"lr=1e-3"'),
    (Sweep, {"variants": {}}, "variants={} must be a non-empty dict"),
    (Sweep, {"variants": ["train.Config.steps = 2"]}, "must be a non-empty dict name -> [bindings]"),
    (Sweep, {"variants": {"a": 3}}, "variants['a']=3 is not a list of binding strings; write {'a': [\"tr"),
    (Sweep, {"variants": {"a": ["x = 1", 2]}}, "variants['a']=['x = 1', 2] is not a list of binding strings"),
    (Sweep, {"variants": ONE, "seeds": 0}, f"seeds=0 must be an int >= 1 and <= {MAX_SEEDS} (each variant"),
    (Sweep, {"variants": ONE, "seeds": MAX_SEEDS + 1}, f"seeds={MAX_SEEDS + 1} must be an int >= 1"),
    (Sweep, {"variants": ONE, "seeds": True}, "seeds=True must be an int >= 1"),
    (Sweep, {"variants": ONE, "cumulative": 1}, "cumulative=1 must be True (each variant adds its bindings"),
    (MixSearch, {"proxies": 3}, "proxies=3 must be an int >= 4, the fewest a fit over two sources needs"),
    (MixSearch, {"proxies": 8.0}, "proxies=8.0 must be an int >= 4"),
    (MixSearch, {"seed": -1}, "seed=-1 must be an int >= 0"),
    (MixSearch, {"alpha": 0.0}, "alpha=0.0 must be a number > 0 (the Dirichlet's concentration"),
    (MixSearch, {"alpha": float("nan")}, "alpha=nan must be a number > 0"),
    (MixSearch, {"target": " "}, "target=' ' must name a yardstick of the runs' reports: 'bpb/mean' (the"),
    (MixSearch, {"seeds": 0}, "seeds=0 must be an int >= 1 and <= 100 (each finalist trains with"),
    (MixSearch, {"replicates": -1}, "replicates=-1 must be an int >= 0 and <= proxies=8 (the first"),
    (MixSearch, {"proxies": 5, "replicates": 6}, "replicates=6 must be an int >= 0 and <= proxies=5"),
    (MixSearch, {"replicates": True}, "replicates=True must be an int >= 0"),
    (MixSearch, {"within_hull": 1}, "within_hull=1 must be True (search the optimum only inside the convex"),
])
def test_each_bad_value_is_refused_naming_it_and_what_is_valid(cls, values, expect):
    with pytest.raises(ValueError) as e:
        cls(**values)
    assert expect in str(e.value), str(e.value)


def test_a_sweep_keeps_its_variants_in_the_files_order_and_hashes():
    chars, dedup = "clean.Config.min_chars = 300", "clean.Config.dedup = False"
    found = Sweep(variants={"b": chars, "a": [dedup]}, seeds=2)       # one binding may be a bare string
    assert found.variants == (("b", (chars,)), ("a", (dedup,)))
    assert hash(found) == hash(dataclasses.replace(found)) and dataclasses.replace(found) == found
    assert found.bindings() == {"b": [chars], "a": [dedup]}
    assert dataclasses.replace(found, cumulative=True).bindings() == {"b": [chars], "a": [chars, dedup]}


def test_proxies_needed_is_the_fits_coefficients_and_one_more():
    for k in range(2, 6):
        assert proxies_needed(k) == mixture_fit.n_coefficients(k) + 1


def _files(kind: str) -> list[str]:
    """The shipped gin files of a kind ("sweeps", "mixsearch"), and their CPU twins (gin/twins/code_share.gin
    includes 'sweeps/code_share.gin'; the search's twin binds mixsearch.* itself)."""
    twins = [path for path in glob.glob(os.path.join(REPO, "gin", "twins", "*.gin"))
             if f"include '{kind}/" in _text(path) or f"\n{kind}." in _text(path)]
    return sorted(glob.glob(os.path.join(REPO, "gin", kind, "*.gin"))) + sorted(twins)


def _text(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.mark.parametrize("path", _files("sweeps"), ids=lambda p: os.path.relpath(p, REPO))
def test_every_shipped_sweep_file_builds_its_settings(path):
    found = sweep.settings([path], [])
    assert isinstance(found, Sweep) and found.variants and 1 <= found.seeds <= MAX_SEEDS


@pytest.mark.parametrize("path", _files("mixsearch"), ids=lambda p: os.path.relpath(p, REPO))
def test_every_shipped_mixsearch_file_builds_its_settings(path):
    found, plan = mixsearch.settings([path], [])
    assert isinstance(found, MixSearch) and found.proxies >= proxies_needed(len(plan.tree.sources))


@pytest.mark.parametrize("param, expect", [
    ("mixsearch.alpha = 0", "mixsearch: alpha=0.0 must be a number > 0"),
    ("mixsearch.alpha = 'one'", "mixsearch.alpha = 'one' has type str; expected float"),
    ("mixsearch.seeds = 1000", f"mixsearch: seeds=1000 must be an int >= 1 and <= {MAX_SEEDS}"),
    ("mixsearch.proxy = 9", "mixsearch has no parameter 'proxy'. Did you mean proxies?"),
    ("mixsearch.replicates = 7", "mixsearch: replicates=7 must be an int >= 0 and <= proxies=6"),
    ("mixsearch.within_hull = 'yes'", "mixsearch.within_hull = 'yes' has type str; expected bool"),
])
def test_a_bad_mixsearch_binding_names_the_binding_and_the_files(param, expect):
    path = os.path.join(REPO, "gin", "mixsearch", "prose_code.gin")
    with pytest.raises(config.ConfigError) as e:
        mixsearch.settings([path], [param])
    assert expect in str(e.value), str(e.value)
    assert path in str(e.value) or param in str(e.value), str(e.value)


def test_a_sweep_file_without_variants_says_what_to_bind():
    with pytest.raises(config.ConfigError) as e:
        sweep.settings([os.path.join(REPO, "gin", "tiny.gin")], [])
    assert "sweep: variants=() must be a non-empty dict name -> [bindings]; bind sweep.variants = " \
           in str(e.value) and "gin/tiny.gin" in str(e.value), str(e.value)
