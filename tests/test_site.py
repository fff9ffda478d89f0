"""The rendered site of the learning path builds, and renders in a real headless browser.

* ``test_site_builds``: ``tools/build_site.py`` stages docs/ and notebooks/ and runs ``mkdocs build``.
  It reuses executed notebooks from ``build/executed_notebooks/`` (written by tests/test_notebooks.py)
  and executes only notebook 02 when there is no up-to-date copy of it, so the notebooks are not run twice.
* ``test_site_in_browser``: Chromium (Debian's ``chromium`` and ``chromium-driver``), driven by selenium,
  loads the home page, the page of notebook 02 and the Chinese home page from a local web server; on each,
  every image has loaded (``naturalWidth > 0``; the home page and the notebook page must have at least one)
  and the browser console has no errors. Screenshots go to ``build/site_screenshots/`` (printed).
  Skips, with the reason, where Chromium, its driver or selenium is missing. Without a Chinese font
  (Debian: ``fonts-noto-cjk``) the Chinese screenshot shows boxes; the test says so.
"""
from __future__ import annotations

import functools
import http.server
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocs_jupyter")
pytest.importorskip("material")

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHOTS = ROOT / "build" / "site_screenshots"
NOTEBOOK_PAGE = "notebooks/02_online_softmax/"
PAGES = {"home": "", "notebook_02": NOTEBOOK_PAGE, "zh_home": "zh/"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    # a stage of its own: under pytest-xdist each worker running a test of this module builds the site
    stage = tmp_path_factory.mktemp("site_src")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "build_site.py"), "--out", str(out), "--stage",
                           str(stage), "--execute", "02"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"tools/build_site.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(proc.stdout)
    return out


@pytest.mark.slow
def test_site_builds(site):
    for page in PAGES.values():
        assert (site / page / "index.html").exists(), f"the site has no page {page or 'index'}"
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert (site / "notebooks" / nb.stem / "index.html").exists(), f"the site has no page for {nb.name}"
    html = (site / NOTEBOOK_PAGE / "index.html").read_text(encoding="utf-8")
    assert "data:image/png;base64" in html, "the page of notebook 02 shows no plot (was it executed?)"
    gif = site / "img" / "tile_walk.gif"
    assert gif.exists(), "docs/img/tile_walk.gif is missing from the site (python tools/make_doc_images.py)"
    assert gif.stat().st_size < 1_000_000, f"docs/img/tile_walk.gif is {gif.stat().st_size} bytes; keep it under 1 MB"
    assert (site / "img" / "pingpong.png").exists(), "docs/img/pingpong.png (backend_cuda.md) is missing from the site"
    assert (site / "img" / "swizzle_96.png").exists(), "docs/img/swizzle_96.png (backend_cuda.md) is missing from the site"


def _browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not chromium or not driver_bin:
        pytest.skip("headless browser check needs Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,1600"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=driver_bin))


@pytest.mark.slow
def test_site_in_browser(site):
    browser = _browser()
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    SHOTS.mkdir(parents=True, exist_ok=True)
    problems = []
    try:
        for label, page in PAGES.items():
            browser.get(base + page)
            browser.execute_script("return document.fonts ? document.fonts.ready : null")
            images = browser.execute_script(
                "return Array.from(document.images).map(i => [i.currentSrc || i.src, i.complete, i.naturalWidth]);")
            broken = [src[:120] for src, complete, width in images if not complete or width == 0]
            if broken:
                problems.append(f"{label}: images that did not render: {broken}")
            if label != "zh_home" and not images:
                problems.append(f"{label}: no images on the page")
            errors = [e["message"][:300] for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
            if errors:
                problems.append(f"{label}: console errors: {errors}")
            if label == "zh_home" and "中文" not in browser.page_source and "算法" not in browser.page_source:
                problems.append("zh_home: the Chinese page shows no Chinese text")
            browser.save_screenshot(str(SHOTS / f"{label}.png"))
            print(f"{label}: {base + page}: {len(images)} images rendered, screenshot {SHOTS / (label + '.png')}")
    finally:
        browser.quit()
        server.shutdown()
    print(f"screenshots in {SHOTS}")
    fc_list = shutil.which("fc-list")
    if fc_list and not subprocess.run([fc_list, ":lang=zh"], capture_output=True, text=True).stdout.strip():
        print("note: no Chinese font is installed, so the Chinese page's screenshot shows boxes for its characters "
              "(apt-get install fonts-noto-cjk)")
    assert not problems, "\n".join(problems)
