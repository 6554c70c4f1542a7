"""Documents over HTTP: ``/v1/translate`` with ``input_format`` and ``split_sentences``, the
LibreTranslate API's ``format: html``, its sentence splitting of ``format: text`` and its file
translation (``/translate_file``, ``/download_file``), against the toy model trained in the
session; LibreTranslate's own client and a plain HTTP client in LibreTranslate's shapes on a live
server, the rest through FastAPI's test client."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser

import httpx
import pytest
from fastapi.testclient import TestClient

from attnmt.decode.translator import Translator
from attnmt.documents import INPUT_FORMATS
from attnmt.serve.app import create_app
from attnmt.serve.settings import ServeSettings
from tests.conftest import live_server, wait_ready

# sentencex (the server's splitter) ends a sentence before a capital letter, not a lowercase one
SENTENCES = ["Ein mann sieht katze.", "Kind spielt ball.", "Frau fährt auto."]
PARAGRAPHS = f"{SENTENCES[0]} {SENTENCES[1]}\n\n{SENTENCES[2]}\n"
SRT = ("1\n00:00:01,000 --> 00:00:02,500\nEin mann sieht katze.\n\n"
       "2\n00:00:03,000 --> 00:00:04,000\nKind spielt ball.\n")


@pytest.fixture(scope="module")
def translator(dictionary_model_dir):
    return Translator.from_dir(dictionary_model_dir)


@pytest.fixture(scope="module")
def expected(translator) -> list[str]:
    """Each of SENTENCES translated alone."""
    out = [t.text for t in translator.translate(SENTENCES)]
    assert all(out)
    return out


@pytest.fixture(scope="module")
def client(translator):
    settings = ServeSettings(max_sentences=4, max_chars=60, max_queue=5, max_body_bytes=200_000)
    with TestClient(create_app(lambda: translator, settings, name="dictionary", languages=("de", "en"))) as c:
        wait_ready(c)
        yield c


@pytest.fixture(scope="module")
def live(translator):
    app = create_app(lambda: translator, ServeSettings(max_sentences=4, max_queue=5), languages=("de", "en"))
    with live_server(app) as url:
        yield url + "/"


def _docx(paragraphs: list[str]) -> bytes:
    import docx

    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _docx_paragraphs(data: bytes) -> list[str]:
    import docx

    return [p.text for p in docx.Document(io.BytesIO(data)).paragraphs]


def _well_formed_tags(html: str) -> list[str]:
    """The start and end tags of ``html`` in order, checked to nest."""
    tags, open_ = [], []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.append(f"<{tag} {dict(attrs)}>" if attrs else f"<{tag}>")
            open_.append(tag)

        def handle_endtag(self, tag):
            assert open_ and open_.pop() == tag, html
            tags.append(f"</{tag}>")

    Tags().feed(html)
    assert not open_, html
    return tags


def test_v1_text_is_cut_into_sentences_and_put_back(client, expected):
    r = client.post("/v1/translate", json={"text": [PARAGRAPHS, ""], "input_format": "text"})
    assert r.status_code == 200, r.text
    assert r.json() == {"translations": [{"text": f"{expected[0]} {expected[1]}\n\n{expected[2]}\n", "hypotheses": []},
                                         {"text": "", "hypotheses": []}]}
    # split_sentences alone: lines cut into sentences, the same document
    lines = client.post("/v1/translate", json={"text": PARAGRAPHS, "split_sentences": True}).json()
    assert lines["translations"][0]["text"] == r.json()["translations"][0]["text"]
    # lines without splitting: each line one sentence
    whole = client.post("/v1/translate", json={"text": PARAGRAPHS, "input_format": "lines"}).json()
    one_line = client.post("/v1/translate", json={"text": f"{SENTENCES[0]} {SENTENCES[1]}"}).json()
    assert whole["translations"][0]["text"] == f"{one_line['translations'][0]['text']}\n\n{expected[2]}\n"


def test_v1_html_keeps_its_markup(client, expected):
    html = (f'<div class="x"><p title="Frau f&auml;hrt auto.">{SENTENCES[0]}</p><p><a href="/k?a=1&amp;b=2">'
            f'{SENTENCES[1]}</a></p><script>var x = "<b>";</script></div>')
    r = client.post("/v1/translate", json={"text": html, "input_format": "html"})
    assert r.status_code == 200, r.text
    out = r.json()["translations"][0]["text"]
    tags = _well_formed_tags(out)
    assert [t.split(" ")[0] for t in tags] == [t.split(" ")[0] for t in _well_formed_tags(html)]
    assert "<a {'href': '/k?a=1&b=2'}>" in tags and f"<p {{'title': '{expected[2]}'}}>" in tags  # title translated
    assert re.sub("<[^>]+>", "", out.split("<script>")[0]) == expected[0] + expected[1]
    assert '<script>var x = "<b>";</script>' in out
    upper = client.post("/v1/translate", json={"text": html, "input_format": "HTML"})  # a name in any case
    assert upper.status_code == 200 and upper.json()["translations"][0]["text"] == out, upper.text


def test_v1_docx_travels_as_base64(client, expected):
    data = base64.b64encode(_docx([PARAGRAPHS.split("\n")[0], SENTENCES[2]])).decode()
    r = client.post("/v1/translate", json={"text": data, "input_format": "docx"})
    assert r.status_code == 200, r.text
    out = base64.b64decode(r.json()["translations"][0]["text"])
    assert _docx_paragraphs(out) == [f"{expected[0]} {expected[1]}", expected[2]]


@pytest.mark.parametrize("body, status, needle", [
    ({"text": "1\n00:00:01,000 -> 00:00:02,000\nEin hund.\n", "input_format": "srt"}, 422, "line 2"),
    ({"text": "not base64!", "input_format": "docx"}, 422, "not base64"),
    ({"text": base64.b64encode(b"no zip").decode(), "input_format": "docx"}, 422, "not a DOCX file"),
    ({"text": "Ein hund.", "input_format": "text", "nbest": 2, "beam_size": 2}, 422, "apply to sentences"),
    ({"text": "Ein hund.", "input_format": "text", "return_attention": True}, 422, "return_attention"),
    ({"text": "Ein hund.", "input_format": "pdf"}, 422, "'html'"),
    ({"text": ["Ein hund."] * 5, "input_format": "text"}, 422, "5 documents; at most 4"),
    ({"text": " ".join(SENTENCES * 2), "input_format": "text"}, 413, "6 sentences; at most 5"),
    ({"text": "Ein hund. " + "katze " * 12, "input_format": "text"}, 413, "characters in one sentence; at most 60"),
])
def test_v1_bad_documents(client, body, status, needle):
    r = client.post("/v1/translate", json=body)
    assert r.status_code == status and needle in str(r.json()["detail"]), r.text


def test_v1_stream_takes_no_document_and_models_lists_the_formats(client):
    r = client.post("/v1/translate/stream", json={"text": "Ein hund.", "input_format": "text"})
    assert r.status_code == 422 and "/v1/translate" in r.json()["detail"]
    assert client.get("/v1/models").json()["data"][0]["input_formats"] == list(INPUT_FORMATS)


def test_libretranslatepy_splits_sentences_as_libretranslate(live, expected):
    from libretranslatepy import LibreTranslateAPI

    assert LibreTranslateAPI(live).translate(PARAGRAPHS, "de", "en") == f"{expected[0]} {expected[1]}\n\n{expected[2]}\n"


def test_libretranslate_html_and_its_errors(live, expected):
    html = f"<p>{SENTENCES[0]} <i>{SENTENCES[1]}</i></p>"
    r = httpx.post(live + "translate", json={"q": [html, ""], "source": "de", "target": "en", "format": "html"})
    assert r.status_code == 200, r.text
    out = r.json()["translatedText"]
    assert out[1] == "" and _well_formed_tags(out[0]) == ["<p>", "<i>", "</i>", "</p>"]
    assert re.sub("<[^>]+>", "", out[0]) == f"{expected[0]} {expected[1]}"
    for body, message in (({"q": "Ein hund.", "source": "de", "target": "en", "format": "xml"},
                           "xml format is not supported"),
                          ({"q": " ".join(SENTENCES * 2), "source": "de", "target": "en"},
                           "Invalid request: request (6) exceeds text limit (4)")):
        r = httpx.post(live + "translate", json=body)
        assert (r.status_code, r.json()) == (400, {"error": message})


def test_libretranslate_translates_files(live, expected):
    """A file in LibreTranslate's multipart shape: a link to the translation, which downloads
    under the file's name with its structure (timings byte-equal)."""
    cases = {"talk.srt": SRT.encode(), "notes.txt": PARAGRAPHS.encode(), "page.html": f"<h1>{SENTENCES[2]}</h1>".encode(),
             "brief.docx": _docx(SENTENCES[:2])}
    got = {}
    for name, data in cases.items():
        r = httpx.post(live + "translate_file", files={"file": (name, data)}, data={"source": "de", "target": "en"})
        assert r.status_code == 200, r.text
        url = r.json()["translatedFileUrl"]
        assert url.startswith(live + "download_file/") and url.endswith("." + name)
        download = httpx.get(url)
        assert download.status_code == 200
        assert download.headers["content-disposition"] == f'attachment; filename="{name}"'
        got[name] = download.content
    srt = got["talk.srt"].decode()
    assert re.findall(r"\d\d:\d\d:\d\d,\d+ --> \S+", srt) == re.findall(r"\d\d:\d\d:\d\d,\d+ --> \S+", SRT)
    assert srt.split("\n")[2] == expected[0] and srt.split("\n")[6] == expected[1]
    assert got["notes.txt"].decode() == f"{expected[0]} {expected[1]}\n\n{expected[2]}\n"
    assert got["page.html"].decode() == f"<h1>{expected[2]}</h1>"
    assert _docx_paragraphs(got["brief.docx"]) == expected[:2]


@pytest.mark.parametrize("files, fields, message", [
    ({"file": ("a.pdf", b"%PDF")}, {"source": "de", "target": "en"}, "Invalid request: file format not supported"),
    ({"file": ("b.srt", b"1\n00:00:01,000 -> x\nEin hund.\n")}, {"source": "de", "target": "en"},
     "Invalid request: b.srt: line 2"),
    ({"file": ("c.txt", b"Ein hund \xff.")}, {"source": "de", "target": "en"}, "Invalid request: c.txt: line 1"),
    ({"file": ("d.docx", b"not a zip")}, {"source": "de", "target": "en"}, "Invalid request: d.docx"),
    ({"file": ("e.txt", " ".join(SENTENCES * 2).encode())}, {"source": "de", "target": "en"},
     "Invalid request: e.txt (6) exceeds text limit (5)"),
    ({"file": ("f.txt", b"Ein hund.")}, {"source": "fr", "target": "en"}, "fr is not supported"),
    ({"other": ("g.txt", b"Ein hund.")}, {"source": "de", "target": "en"}, "Invalid request: missing file parameter"),
])
def test_libretranslate_file_errors_are_400(live, files, fields, message):
    r = httpx.post(live + "translate_file", files=files, data=fields)
    assert r.status_code == 400 and r.json()["error"].startswith(message), r.text


def test_an_unknown_download_is_404(live):
    r = httpx.get(live + "download_file/00000000-0000-0000-0000-000000000000.x.txt")
    assert r.status_code == 404 and "Invalid filename" in r.json()["error"]
