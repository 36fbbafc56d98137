"""W&B tracking that could not start is one `error:` line and exit 2 before any stage runs
(stages/train/tracking.py `problem`, from train's `check`): online with no API key, online with a key and no
server to reach, a directory W&B cannot write its files in. Each runs the CLI as
tests/pipeline/test_bad_config.py does.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_bad_tracking.py

The W&B environment of each case is its own: a HOME without a ~/.netrc, no W&B settings file, no WANDB_*
variable but those the case sets, so a key on the machine running the tests changes nothing.
"""

from __future__ import annotations

import os
import socket

import pytest

from stages.train import tracking
from tests.pipeline.test_bad_config import _case, assert_one_error_line_before_work

KEY = "k" * 40                        # a key in the form W&B accepts; never sent anywhere
CLOSED = "http://127.0.0.1:1"         # nothing listens on port 1 of loopback: refused at once
ONLINE = ('train.Tracking.tracker="wandb"', 'train.Tracking.mode="online"')
OFFLINE = ('train.Tracking.tracker="wandb"', 'train.Tracking.mode="offline"')

CASES = [
    # (the case, the W&B environment variables it runs with)
    (_case("online_without_an_api_key",
           ["train: train.Tracking.mode='online' needs a W&B API key for http://127.0.0.1:1 and none is set",
            "set WANDB_API_KEY or run `wandb login`", "or set train.Tracking.mode='offline'"], *ONLINE),
     {"WANDB_BASE_URL": CLOSED}),
    (_case("online_with_a_key_in_a_form_wandb_refuses",
           ["train: train.Tracking.mode='online': W&B refuses its credentials for http://127.0.0.1:1",
            "WANDB_API_KEY invalid"], *ONLINE),
     {"WANDB_BASE_URL": CLOSED, "WANDB_API_KEY": "short"}),
    (_case("online_with_a_key_and_no_server",
           ["train: train.Tracking.mode='online': W&B's server http://127.0.0.1:1 cannot be reached "
            "(127.0.0.1:1: Connection refused)", "check the network or WANDB_BASE_URL"], *ONLINE),
     {"WANDB_BASE_URL": CLOSED, "WANDB_API_KEY": KEY}),
    (_case("tracking_dir_under_a_regular_file",
           ["train: W&B cannot write its files in train.Tracking.dir='{dir}/file/wandb' ({dir}/file is a "
            "file, not a directory)", "set train.Tracking.dir to a directory you can write"],
           *OFFLINE, 'train.Tracking.dir="{dir}/file/wandb"', files=(("file", "not a directory"),)),
     {}),
    (_case("wandb_dir_under_a_regular_file",
           "W&B cannot write its files in WANDB_DIR (train.Tracking.dir is empty)='{dir}/file/wandb'",
           *OFFLINE, files=(("file", "not a directory"),)),
     {"WANDB_DIR": "{dir}/file/wandb"}),
    (_case("tracking_dir_in_a_bucket",
           "train: train.Tracking.dir='gs://bucket/wandb' is not a local directory: W&B writes its run files "
           "on a local disk", *OFFLINE, 'train.Tracking.dir="gs://bucket/wandb"'),
     {}),
]


def _isolate(monkeypatch, tmp_path, env: dict[str, str]) -> None:
    """The W&B environment of a case: nothing from the machine's (key, netrc, settings), then `env`."""
    for name in [n for n in os.environ if n.startswith("WANDB_")] + ["NETRC", "HTTP_PROXY", "HTTPS_PROXY",
                                                                     "http_proxy", "https_proxy"]:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(dir=tmp_path / "case"))


@pytest.mark.parametrize("case, env", CASES, ids=[c.name for c, _ in CASES])
def test_tracking_that_cannot_start_is_one_error_line_before_anything_runs(case, env, tmp_path, monkeypatch):
    _isolate(monkeypatch, tmp_path, env)
    assert_one_error_line_before_work(case, tmp_path)


@pytest.fixture
def fresh_wandb():
    """W&B's settings are read once per process: each test reads its own environment, and leaves none."""
    import wandb

    wandb.teardown()
    yield
    wandb.teardown()


def test_online_with_a_key_and_a_server_that_answers_passes(tmp_path, monkeypatch, fresh_wandb):
    with socket.create_server(("127.0.0.1", 0)) as server:
        _isolate(monkeypatch, tmp_path, {"WANDB_API_KEY": KEY,
                                         "WANDB_BASE_URL": f"http://127.0.0.1:{server.getsockname()[1]}"})
        monkeypatch.chdir(tmp_path)
        assert tracking.problem(tracking.Tracking(tracker="wandb", mode="online")) == ""
    assert os.listdir(tmp_path) == ["home"]           # the write probe left nothing in the W&B directory


def test_a_key_in_the_netrc_wandb_login_writes_is_found(tmp_path, monkeypatch, fresh_wandb):
    _isolate(monkeypatch, tmp_path, {"WANDB_BASE_URL": CLOSED})
    (tmp_path / "home" / ".netrc").write_text(f"machine 127.0.0.1:1\n  login user\n  password {KEY}\n")
    os.chmod(tmp_path / "home" / ".netrc", 0o600)
    monkeypatch.chdir(tmp_path)
    # Past the key: what stops it now is the server, not the credentials.
    assert "W&B's server http://127.0.0.1:1 cannot be reached" in tracking.problem(
        tracking.Tracking(tracker="wandb", mode="online"))


def test_tracking_off_or_offline_in_a_writable_directory_needs_nothing(tmp_path, monkeypatch):
    _isolate(monkeypatch, tmp_path, {"WANDB_BASE_URL": CLOSED})     # online would fail here
    assert tracking.problem(tracking.Tracking()) == ""
    assert tracking.problem(tracking.Tracking(tracker="wandb", mode="disabled")) == ""
    offline = tracking.Tracking(tracker="wandb", mode="offline", dir=str(tmp_path / "a" / "b"))
    assert tracking.problem(offline) == ""
    assert not os.path.exists(tmp_path / "a")
