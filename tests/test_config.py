"""Configuration resolution, URLs, headers and query encoding (contract §1)."""

from __future__ import annotations

import enum
import json
import platform

import orjson
import pytest
from _wire import trace

from prime_traces import TracesClient, UnauthorizedError
from prime_traces.config import (
    DEFAULT_BASE_URL,
    ClientConfig,
    api_url,
    default_headers,
    encode_query,
    normalize_base_url,
    quote_path_id,
    require_api_key,
    resolve_config,
)
from prime_traces.server import LocalTracesService


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.json"

    def write(data) -> str:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        return str(path)

    return write


@pytest.fixture
def missing_file(tmp_path) -> str:
    return str(tmp_path / "absent.json")


# --- base URL ---------------------------------------------------------------


def test_base_url_defaults_when_nothing_is_set(missing_file):
    config = resolve_config(environ={}, config_path=missing_file)
    assert config.base_url == DEFAULT_BASE_URL == "https://api.primeintellect.ai"


def test_base_url_precedence_argument_env_file(config_file):
    path = config_file({"traces_url": "http://file.example"})
    env = {"PRIME_TRACES_URL": "http://env.example"}
    config = resolve_config(base_url="http://arg.example", environ=env, config_path=path)
    assert config.base_url == "http://arg.example"
    assert resolve_config(environ=env, config_path=path).base_url == "http://env.example"
    assert resolve_config(environ={}, config_path=path).base_url == "http://file.example"


def test_empty_base_url_argument_and_env_fall_through(config_file):
    path = config_file({"traces_url": "http://file.example/api/v1/"})
    config = resolve_config(base_url="", environ={"PRIME_TRACES_URL": ""}, config_path=path)
    assert config.base_url == "http://file.example"


def test_platform_base_url_settings_are_never_used(config_file):
    path = config_file({"base_url": "http://platform-file.example"})
    env = {"PRIME_API_BASE_URL": "http://a.example", "PRIME_BASE_URL": "http://b.example"}
    assert resolve_config(environ=env, config_path=path).base_url == DEFAULT_BASE_URL


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("http://h:1", "http://h:1"),
        ("http://h:1/", "http://h:1"),
        ("http://h:1///", "http://h:1"),
        ("http://h:1/api/v1", "http://h:1"),
        ("http://h:1/api/v1/", "http://h:1"),
        ("http://h:1/api/v1/api/v1", "http://h:1/api/v1"),
        ("http://h:1/prefix/api/v1", "http://h:1/prefix"),
        ("http://h:1/api/v2", "http://h:1/api/v2"),
    ],
)
def test_normalize_base_url(raw, expected):
    assert normalize_base_url(raw) == expected


def test_argument_base_url_is_normalized(missing_file):
    config = resolve_config(base_url="http://h/api/v1/", environ={}, config_path=missing_file)
    assert config.base_url == "http://h"


# --- API key ----------------------------------------------------------------


def test_api_key_precedence(config_file):
    path = config_file({"api_key": "file-key"})
    env = {"PRIME_API_KEY": "env-key"}
    assert resolve_config(api_key="arg-key", environ=env, config_path=path).api_key == "arg-key"
    assert resolve_config(environ=env, config_path=path).api_key == "env-key"
    assert resolve_config(environ={}, config_path=path).api_key == "file-key"


def test_empty_api_key_argument_is_final(config_file):
    path = config_file({"api_key": "file-key"})
    config = resolve_config(api_key="", environ={"PRIME_API_KEY": "env-key"}, config_path=path)
    assert config.api_key == ""


def test_empty_env_api_key_falls_through_to_file(config_file):
    path = config_file({"api_key": "file-key"})
    assert resolve_config(environ={"PRIME_API_KEY": ""}, config_path=path).api_key == "file-key"


def test_api_key_defaults_to_empty(missing_file):
    assert resolve_config(environ={}, config_path=missing_file).api_key == ""


def _key_sources(config_file, key):
    """``resolve_config`` keyword arguments that give ``key`` from each source, by name."""
    return {
        "argument": {"api_key": key, "environ": {}, "config_path": config_file({})},
        "PRIME_API_KEY": {"environ": {"PRIME_API_KEY": key}, "config_path": config_file({})},
        "config file": {"environ": {}, "config_path": config_file({"api_key": key})},
    }


@pytest.mark.parametrize("source", ["argument", "PRIME_API_KEY", "config file"])
@pytest.mark.parametrize("raw", ["pk-abc123\n", "pk-abc123\r\n", " pk-abc123\t", "\npk-abc123 "])
def test_surrounding_whitespace_is_stripped_from_the_key(config_file, source, raw):
    assert resolve_config(**_key_sources(config_file, raw)[source]).api_key == "pk-abc123"


def test_blank_env_api_key_falls_through_to_file(config_file):
    path = config_file({"api_key": "file-key"})
    assert resolve_config(environ={"PRIME_API_KEY": " \n"}, config_path=path).api_key == "file-key"


@pytest.mark.parametrize(
    ("source", "named"),
    [("argument", "api_key argument"), ("PRIME_API_KEY", "PRIME_API_KEY"), ("config file", "config.json")],
)
@pytest.mark.parametrize("stray", ["\x00", "\x1b", "\x7f", " ", "\n", "\u200b", "\u2019", "é"])
def test_key_with_an_inner_stray_character_is_refused_without_showing_it(config_file, source, named, stray):
    key = f"pk-secret{stray}7f3a9c1e"
    with pytest.raises(ValueError) as info:
        resolve_config(**_key_sources(config_file, key)[source])
    message = str(info.value)
    assert named in message and f"U+{ord(stray):04X}" in message
    assert "pk-secret" not in message and "7f3a9c1e" not in message


def test_a_bad_key_in_a_source_that_is_not_used_is_not_an_error(config_file):
    path = config_file({"api_key": "pk-bad\x00key"})
    assert resolve_config(environ={"PRIME_API_KEY": "env-key"}, config_path=path).api_key == "env-key"


def test_key_with_a_trailing_newline_works_against_the_service(tmp_path, monkeypatch, missing_file):
    # The service checks the exact key, so this passes only if what was sent is the stripped key.
    with LocalTracesService(tmp_path / "keyed.db", api_key="pk-abc123") as svc:
        monkeypatch.setenv("PRIME_API_KEY", "pk-abc123\n")
        with TracesClient(base_url=svc.url, config_path=missing_file, _sleep=lambda seconds: None) as client:
            (receipt,) = client.upload_lines([orjson.dumps(trace("t-newline"))])
            assert client.get("t-newline").trace_id == "t-newline"
        assert receipt.upload_id


# --- team -------------------------------------------------------------------


def test_team_precedence(config_file):
    path = config_file({"team_id": "file-team"})
    env = {"PRIME_TEAM_ID": "env-team"}
    assert resolve_config(team_id="arg-team", environ=env, config_path=path).team_id == "arg-team"
    assert resolve_config(environ=env, config_path=path).team_id == "env-team"
    assert resolve_config(environ={}, config_path=path).team_id == "file-team"


def test_env_team_set_but_empty_overrides_file(config_file):
    path = config_file({"team_id": "file-team"})
    assert resolve_config(environ={"PRIME_TEAM_ID": ""}, config_path=path).team_id == ""


def test_null_team_in_file_means_no_team(config_file):
    path = config_file({"team_id": None})
    assert resolve_config(environ={}, config_path=path).team_id == ""


# --- config file robustness ------------------------------------------------


@pytest.mark.parametrize(
    "content",
    ["{not json", "[1, 2, 3]", '"a string"', "null", ""],
    ids=["bad-json", "list", "string", "null", "empty"],
)
def test_bad_config_file_counts_as_empty(config_file, content):
    path = config_file(content)
    config = resolve_config(environ={}, config_path=path)
    assert (config.api_key, config.base_url, config.team_id) == ("", DEFAULT_BASE_URL, "")


def test_undecodable_config_file_counts_as_empty(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"api_key": "\xff\xfe"}')
    assert resolve_config(environ={}, config_path=path).api_key == ""


def test_directory_as_config_file_counts_as_empty(tmp_path):
    assert resolve_config(environ={}, config_path=tmp_path).api_key == ""


def test_non_string_config_values_are_ignored(config_file):
    path = config_file({"api_key": 123, "traces_url": ["x"], "team_id": 7})
    config = resolve_config(environ={}, config_path=path)
    assert (config.api_key, config.base_url, config.team_id) == ("", DEFAULT_BASE_URL, "")


def test_reads_home_config_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".prime").mkdir()
    (tmp_path / ".prime" / "config.json").write_text(json.dumps({"api_key": "home-key"}))
    assert resolve_config(environ={}).api_key == "home-key"


def test_reads_os_environ_by_default(missing_file, monkeypatch):
    monkeypatch.setenv("PRIME_API_KEY", "from-os-env")
    assert resolve_config(config_path=missing_file).api_key == "from-os-env"


# --- repr and key handling ---------------------------------------------------


def test_repr_never_shows_the_key():
    config = ClientConfig(api_key="pk-super-secret", base_url="http://h", team_id="t")
    text = repr(config)
    assert "pk-super-secret" not in text
    assert "api_key=<set>" in text and "'http://h'" in text
    assert "api_key=<unset>" in repr(ClientConfig(api_key=""))


def test_config_is_frozen():
    config = ClientConfig(api_key="k")
    with pytest.raises(AttributeError):
        config.api_key = "other"  # type: ignore[misc]


def test_require_api_key_fails_locally_without_the_key():
    with pytest.raises(UnauthorizedError) as info:
        require_api_key(ClientConfig(api_key=""))
    assert "PRIME_API_KEY" in str(info.value) and "api_key=" in str(info.value)
    assert info.value.status_code == 401
    assert require_api_key(ClientConfig(api_key="k")) == "k"


# --- headers ----------------------------------------------------------------


def test_default_headers_with_team():
    headers = default_headers(ClientConfig(api_key="k1", team_id="team-9"))
    assert headers == {
        "User-Agent": f"prime-traces/0.0.10 python/{platform.python_version()}",
        "Authorization": "Bearer k1",
        "X-Prime-Team-ID": "team-9",
    }


def test_default_headers_omit_empty_team():
    assert "X-Prime-Team-ID" not in default_headers(ClientConfig(api_key="k1", team_id=""))


def test_default_headers_refuse_an_empty_key():
    with pytest.raises(UnauthorizedError):
        default_headers(ClientConfig(api_key=""))


# --- paths ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("abc-123", "abc-123"),
        ("a b", "a%20b"),
        ("a?b#c", "a%3Fb%23c"),
        ("ü", "%C3%BC"),
        ("a.b", "a.b"),
        (".", "%2E"),
        ("..", "%2E%2E"),
        ("...", "..."),
        ("%2F", "%252F"),
    ],
)
def test_quote_path_id(value, expected):
    assert quote_path_id(value) == expected


@pytest.mark.parametrize("value", ["a/b", "/", "", "../x"])
def test_quote_path_id_refuses(value):
    with pytest.raises(ValueError):
        quote_path_id(value)


def test_api_url_builds_segments():
    assert api_url("http://h:1", "traces") == "http://h:1/api/v1/traces"
    assert api_url("http://h:1", "traces", "t 1", "nodes") == "http://h:1/api/v1/traces/t%201/nodes"
    assert api_url("http://h:1", "episodes", "..") == "http://h:1/api/v1/episodes/%2E%2E"
    assert api_url("http://h:1") == "http://h:1/api/v1"


def test_api_url_refuses_slash_in_an_id():
    with pytest.raises(ValueError, match="must not contain '/'"):
        api_url("http://h", "traces", "a/b")


# --- query ------------------------------------------------------------------


class _Color(str, enum.Enum):
    RED = "red"


def test_encode_query_rules():
    pairs = encode_query(
        {
            "run_id": "r1",
            "environment_id": None,
            "has_error": True,
            "is_truncated": False,
            "limit": 20,
            "reward_min": 1e-07,
            "reward_max": 0.5,
            "upload_id": ["a", "b"],
            "context": {"source": "prime-runs", "run_type": "eval"},
            "outcome": _Color.RED,
        }
    )
    assert pairs == [
        ("run_id", "r1"),
        ("has_error", "true"),
        ("is_truncated", "false"),
        ("limit", "20"),
        ("reward_min", "1e-07"),
        ("reward_max", "0.5"),
        ("upload_id", "a"),
        ("upload_id", "b"),
        ("context.source", "prime-runs"),
        ("context.run_type", "eval"),
        ("outcome", "red"),
    ]


def test_encode_query_empty_list_and_empty_context_send_nothing():
    assert encode_query({"upload_id": [], "context": {}}) == []


def test_encode_query_refuses_unknown_types():
    with pytest.raises(TypeError, match="created_after"):
        encode_query({"created_after": object()})
