"""Which URLs the "Watch a server" tab fetches (serving/access.py) in its three settings: a local app (127.0.0.1),
an app listening beyond loopback (GRADIO_SERVER_NAME=0.0.0.0), and public mode. A refused URL must never be
connected to: the HTTP client is recorded, and a refusal must come before any request."""
from __future__ import annotations

import html
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from test_watch_tab import served  # noqa: F401  (the fixture)

from specviz.serving import access, export
from specviz.serving.access import Access, AccessError
from specviz.ui import watch as tab


@pytest.fixture
def sent(monkeypatch):
    """Every URL the HTTP client is asked to send to (httpx's transport, before any connection)."""
    urls: list[str] = []
    original = httpx.HTTPTransport.handle_request

    def record(self, request):
        urls.append(str(request.url))
        return original(self, request)

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", record)
    return urls


@pytest.fixture
def local(monkeypatch):
    for name in ("SPECVIZ_PUBLIC", "SPACE_ID", "SPECVIZ_WATCH_HOSTS", "GRADIO_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def status_of(out) -> str:
    return html.unescape(out[2])


def specviz_page() -> str:
    ex = export.Exporter()
    ex.declare("eagle")
    return ex.text()


def test_default_mode_refuses_the_metadata_address_before_any_connection(local, sent):
    out = tab.watch_start("http://169.254.169.254/latest/meta-data/", 2)
    line = status_of(out)
    assert "169.254.169.254, a link-local address" in line and "add 169.254.169.254 to SPECVIZ_WATCH_HOSTS" in line
    assert "\n" not in line and out[0] == {"__type__": "update"}  # no watch started
    assert sent == []  # nothing was sent there, nor anywhere
    for url in ("http://[fe80::1]:8000", "http://[::ffff:169.254.169.254]/"):
        with pytest.raises(AccessError, match="link-local"):
            access.check(url)
    assert sent == []


def test_a_name_resolving_to_link_local_is_refused_after_resolution(local, sent):
    local.setattr(access, "resolve", lambda host, port: ["10.0.0.7", "169.254.169.254"])
    out = tab.watch_start("http://metadata.google.internal/computeMetadata/v1/", 2)
    assert "'metadata.google.internal' resolves to 169.254.169.254, a link-local address" in status_of(out)
    assert "add metadata.google.internal to SPECVIZ_WATCH_HOSTS" in status_of(out) and sent == []


def test_the_allow_list_lets_a_link_local_address_through_outside_public_mode(local):
    local.setenv("SPECVIZ_WATCH_HOSTS", "169.254.10.20")
    assert access.check("http://169.254.10.20:8000") == "http://169.254.10.20:8000"
    local.setenv("SPECVIZ_PUBLIC", "1")  # a public deployment never fetches one
    with pytest.raises(AccessError, match="a public deployment fetches public addresses only"):
        access.check("http://169.254.10.20:8000")


def test_a_redirect_to_the_metadata_address_is_not_followed(local, sent):
    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        line = status_of(tab.watch_start(url, 2))
        assert "answered HTTP 302" in line
        assert sent == [url + "/metrics"]  # one request, to the server given, none to where it pointed
    finally:
        server.shutdown()
        server.server_close()


def test_a_local_app_watches_an_engine_on_loopback(local, served, sent):  # noqa: F811
    url, page = served
    page["text"] = specviz_page()
    out = tab.watch_start(url, 2)
    assert "Watching" in status_of(out) and out[0].url == url and sent == [url + "/metrics"]
    assert "Any http(s) URL but a link-local one" in tab.intro_html(7861) and "127.0.0.1:7861" in tab.intro_html(7861)


@pytest.mark.parametrize("listen", ["0.0.0.0", "::", "192.168.1.4", "[::]"])
def test_an_app_listening_beyond_loopback_refuses_loopback_and_private_unless_allowed(local, served, sent,  # noqa: F811
                                                                                    listen):
    url, page = served
    page["text"] = specviz_page()
    local.setenv("GRADIO_SERVER_NAME", listen)
    rules = Access.from_env()
    assert rules.exposed and not rules.public
    line = status_of(tab.watch_start(url, 2))
    assert "resolves to 127.0.0.1, a loopback address: this app listens beyond loopback" in line
    assert "add 127.0.0.1 to SPECVIZ_WATCH_HOSTS" in line and "\n" not in line
    for private in ("http://10.1.2.3:8000", "http://192.168.0.9/metrics", "http://[fd00::5]:8000"):
        with pytest.raises(AccessError, match="private address: this app listens beyond loopback"):
            access.check(private)
    with pytest.raises(AccessError, match="link-local"):
        access.check("http://169.254.169.254/")
    assert sent == []
    assert access.check("http://93.184.216.34:8000") == "http://93.184.216.34:8000"  # public addresses: fetched
    assert "watches public addresses only" in tab.intro_html()
    local.setenv("SPECVIZ_WATCH_HOSTS", "127.0.0.1")  # the operator allows the engine beside the app
    assert "Watching" in status_of(tab.watch_start(url, 2)) and sent == [url + "/metrics"]


@pytest.mark.parametrize("listen, exposed", [("", False), ("127.0.0.1", False), ("localhost", False), ("::1", False),
                                             ("127.0.0.2", False), ("0.0.0.0", True), ("10.0.0.4", True),
                                             ("no-such-host.invalid", True)])
def test_what_counts_as_listening_beyond_loopback(listen, exposed):
    assert access.beyond_loopback(listen) is exposed
