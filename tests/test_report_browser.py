"""The report page as a person sees it: ``vrh report`` output opened in headless Chromium (selenium).

A real run folder is made by ``vrh demo`` on the shipped toy model A (transfer partner: toy A itself, so
the cross-masking section is present with the same backbone grid), then ``vrh report`` writes the page.
In the browser: the page loads, every figure decodes to a non-empty image of the PNG's size, the figure
count and captions are the ones the folder's artifacts call for, and every table cell shows the value of
its CSV. The browser pieces are Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them when
it runs as root) and the ``selenium`` package (``test`` extra); without them the test skips, saying which.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vrh_interp.cli import main
from vrh_interp.report import TABLES

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "apt-get install chromium chromium-driver"


def _start_browser():
    """A headless Chromium session, or a skip naming what is missing."""
    if not CHROMIUM.exists():
        pytest.skip(f"chromium not found at {CHROMIUM}: {INSTALL}")
    if not CHROMEDRIVER.exists():
        pytest.skip(f"chromedriver not found at {CHROMEDRIVER}: {INSTALL}")
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("the selenium package is not installed: pip install -e '.[test]'")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1200,900"):
        options.add_argument(argument)
    try:  # an explicit driver path: selenium never tries to download one
        return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    except WebDriverException as error:
        pytest.skip(f"{CHROMIUM} did not start under {CHROMEDRIVER}: {error.msg}")


@pytest.fixture(scope="module")
def browser():
    driver = _start_browser()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def report_page(browser, tmp_path_factory):
    """A demo run folder with its report loaded in the browser (the browser is checked first: no demo when
    the test would skip anyway)."""
    run = tmp_path_factory.mktemp("report") / "demo"
    assert main(["demo", "--model", "toy:a", "--transfer-model", "toy:a", "--out", str(run), "--detect", "8",
                 "--eval", "6", "--random-sets", "2", "--json"]) == 0
    assert main(["report", str(run)]) == 0
    browser.get((run / "report.html").as_uri())
    return run, browser


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def _matches(cell: str, value: object) -> bool:
    """Does the text the browser shows in a cell stand for ``value`` from the CSV (floats shown to 3 places)?"""
    if isinstance(value, (bool, np.bool_)):
        return cell == str(bool(value))
    if isinstance(value, (int, np.integer)):
        return cell == str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return cell == "NaN"
        return abs(float(cell) - float(value)) <= 5e-4 + 1e-9
    return cell == " ".join(str(value).split())


def test_page_loads_with_every_figure_decoded(report_page):
    run, browser = report_page
    assert browser.execute_script("return document.readyState") == "complete"
    assert browser.title == "vrh-interp report"
    assert browser.find_element("tag name", "h1").text == f"vrh-interp report: {run.name}"
    # wide tables scroll in their own box: the page itself never scrolls sideways
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    images = browser.execute_script(
        "return [...document.images].map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight,"
        " i.getBoundingClientRect().width, i.src.startsWith('data:image/png;base64,')])")
    # what the folder calls for: 2 figures per score file, k-sweep + failure split, design space, cross-masking
    score_files = [p.stem for p in sorted(run.glob("scores-*.json"))]  # the report's order
    assert sorted(score_files) == ["scores-vrh", "scores-vrh-b"]
    expected = [name for stem in score_files for name in (f"{stem} heatmap", f"{stem} distribution")]
    expected += ["k-sweep", "failure decomposition", "design space", "cross-model masking"]
    assert [alt for alt, *_ in images] == expected
    captions = [c.text for c in browser.find_elements("tag name", "figcaption")]
    assert captions == expected
    for alt, complete, width, height, shown_width, embedded in images:
        assert complete and width > 0 and height > 0, f"figure {alt!r} is broken"
        assert shown_width > 0, f"figure {alt!r} is not laid out"
        assert embedded, f"figure {alt!r} is not embedded"
        slug = "".join(c if c.isalnum() else "_" for c in alt)
        assert (width, height) == _png_size(run / "figures" / f"{slug}.png"), alt
    markdown = (run / "report.md").read_text()
    assert all(f"(figures/{''.join(c if c.isalnum() else '_' for c in name)}.png)" in markdown for name in expected)


def test_tables_show_the_run_folders_numbers(report_page):
    run, browser = report_page
    tables = browser.execute_script(
        "return [...document.querySelectorAll('h2')].map(h => { const t = h.nextElementSibling;"
        " return [h.textContent, [...t.querySelectorAll('thead th')].map(c => c.innerText.trim()),"
        " [...t.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.innerText.trim()))]; })")
    expected = [(title, pd.read_csv(run / name)) for name, title in TABLES if (run / name).exists()]
    assert [title for title, _ in expected] == [title for title, *_ in tables]
    assert {"Causal k-sweep: top-k heads vs random and layer-matched head sets",
            "Cross-masking k-sweep: own, transferred and random heads in each model"} <= {t for t, _ in expected}
    for (title, frame), (_, header, rows) in zip(expected, tables):
        assert header == list(frame.columns), title
        assert len(rows) == len(frame), title
        for index, (row, values) in enumerate(zip(rows, frame.itertuples(index=False))):
            for column, cell, value in zip(frame.columns, row, values):
                assert _matches(cell, value), f"{title}, row {index}, {column}: page shows {cell!r}, CSV has {value!r}"
    # Across tables, from the page alone: masking model A's own top-k in the cross-masking sweep is the
    # k-sweep's top-k condition (same model, heads and scenes), so the two tables must agree.
    page = {title: pd.DataFrame(rows, columns=header) for title, header, rows in tables}
    sweep = page["Causal k-sweep: top-k heads vs random and layer-matched head sets"]
    cross = page["Cross-masking k-sweep: own, transferred and random heads in each model"]
    own_in_a = cross[(cross["model"] == "A (toy:a)") & (cross["condition"].isin(["baseline", "own"]))]
    top = sweep[sweep["condition"].isin(["baseline", "top"])]
    assert own_in_a[["k", "accuracy", "mean_iou"]].values.tolist() == top[["k", "accuracy", "mean_iou"]].values.tolist()
    assert len(own_in_a) == 4  # k = 0, 1, 2, 3 on the toy's 32 heads (demo_ks)


def test_report_page_screenshot_is_not_blank(report_page):
    """The rendered page has content (a blank or error page would be near uniform)."""
    from PIL import Image

    run, browser = report_page
    shot = run / "report_screenshot.png"  # kept in the run folder for a person to look at
    assert browser.save_screenshot(str(shot))
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape[0] > 100 and pixels.std() > 5
