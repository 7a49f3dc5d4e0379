"""A server's URL in its one spelling (`playbooks.http.normalised_url`): two configurations
that name one server differently agree on the key its claim is kept under."""

from __future__ import annotations

import pytest

from playbooks.http import normalised_url


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("http://127.0.0.1:30000", "http://127.0.0.1:30000"),
        ("http://127.0.0.1:30000/", "http://127.0.0.1:30000"),
        ("HTTP://GPU-7.Example.COM:8000", "http://gpu-7.example.com:8000"),
        ("http://gpu-7", "http://gpu-7:80"),
        ("http://gpu-7:80/", "http://gpu-7:80"),
        ("https://gpu-7", "https://gpu-7:443"),
        ("https://gpu-7:443", "https://gpu-7:443"),
        ("https://gpu-7:8443/", "https://gpu-7:8443"),
        ("http://[::1]:30000/", "http://[::1]:30000"),
        ("http://[FE80::1]", "http://[fe80::1]:80"),
        ("http://gw:8080/Model-A/", "http://gw:8080/Model-A"),  # paths keep their case
        ("http://user:secret@gpu-7:30000", "http://gpu-7:30000"),  # no credentials stored
        ("  http://gpu-7:30000  ", "http://gpu-7:30000"),
    ],
)
def test_one_spelling(url: str, key: str) -> None:
    assert normalised_url(url) == key


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://gpu-7:21", "not an http"),
        ("gpu-7:30000", "not an http"),
        ("http://", "not an http"),
        ("http://gpu-7:0", "no valid port"),
        ("http://gpu-7:99999", "no valid port"),
        ("http://gpu-7:port", "no valid port"),
    ],
)
def test_not_a_server_url(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        normalised_url(url)
