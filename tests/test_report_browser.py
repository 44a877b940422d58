"""The report page as a person sees it: ``vrh report`` output opened in headless Chromium (selenium).

A real run folder is made by ``vrh demo`` on the shipped toy model A (transfer partner: toy A itself, so
the cross-masking section is present with the same backbone grid; the positive control on toy:planted
where its checkpoint is shipped), then ``vrh report`` writes the page. In the browser: the page loads and
leads with the positive control line (when run), the two claims tables and the figures, every figure decodes to a non-empty image of
the PNG's size, the figure count, order and captions are the ones the folder's artifacts call for, every
table sits in a collapsible block and every cell shows the value of its CSV. The browser pieces are Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them when
it runs as root) and the ``selenium`` package (``test`` extra); without them the test skips, saying which.
"""  # noqa: E501

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vrh_interp.apps.cli import main
from vrh_interp.apps.report import TABLES

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
    from vrh_interp.experiments import positive_control

    run = tmp_path_factory.mktemp("report") / "demo"
    control = [] if positive_control.available() else ["--no-positive-control"]
    assert main(["demo", "--model", "toy:a", "--transfer-model", "toy:b", "--out", str(run), "--detect", "8",
                 "--eval", "6", "--random-sets", "2", "--check-items", "8", "--vqa-scenes", "3", "--rank-sets", "20",
                 "--json",
                 *control]) == 0
    assert main(["report", str(run)]) == 0
    browser.get((run / "report.html").as_uri())
    return run, browser


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def _matches(cell: str, value: object, column: str = "") -> bool:
    """Does the text the browser shows in a cell stand for ``value`` from the CSV (floats shown to 3 places; an
    empty ``seed`` or ``sets`` shown as "-")?"""
    if isinstance(value, (bool, np.bool_)):
        return cell == str(bool(value))
    if isinstance(value, (int, np.integer)):
        return cell == str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return cell == ("-" if column in ("seed", "sets") else "NaN")
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
    # what the folder calls for, pictures a reader looks for first: k-sweep, heatmaps (the main model's first),
    # score vs damage, overlays; then failure split, score distributions, design space, cross-masking
    score_files = [p.stem for p in sorted(run.glob("scores-*.json"), key=lambda p: (len(p.stem), p.stem))]
    assert score_files == ["scores-vrh", "scores-vrh-b"]
    overlays = [f"attention overlay {p.stem}" for p in sorted((run / "overlays").glob("*.png"))]
    assert len(overlays) == 3
    expected = ["k-sweep", *(f"{stem} heatmap" for stem in score_files), "score vs single-head damage", *overlays,
                "failure decomposition", *(f"{stem} distribution" for stem in score_files), "design space",
                "cross-model masking"]
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


def test_page_leads_with_the_positive_control_then_the_claims(report_page):
    run, browser = report_page
    ran = (run / "positive_control" / "positive_control.json").exists()
    # the first thing on the page after the title: the positive control's one line (when it ran), then the two
    # claims tables with a verdict badge a row, then the figures, then the tables
    first = browser.find_element("css selector", "h1 + *")
    if ran:
        assert first.get_attribute("id") == "positive-control"
        assert first.text.startswith("Positive control (toy:planted): ")
    headings = [h.text for h in browser.find_elements("tag name", "h2")]
    assert headings == ["The paper's claims", "Checks of the method", "Figures", "Tables"]
    claims = pd.read_csv(run / "verdicts.csv")
    for table, part in zip(browser.find_elements("css selector", "table.claims"), ("paper", "method")):
        rows = [[c.text for c in r.find_elements("tag name", "td")] for r in table.find_elements("tag name", "tr")[1:]]
        expected = claims[claims["table"] == part]
        assert [row[0] for row in rows] == expected["verdict"].tolist()
        assert [row[1] for row in rows] == expected["claim"].tolist()
        assert all(row[0] in ("holds", "does not hold", "inconclusive", "not measured") for row in rows)
    # every table below is collapsible and starts closed: the answer is above
    summaries = browser.execute_script(
        "return [...document.querySelectorAll('details')].map(d => [d.querySelector('summary').textContent, d.open])")
    assert summaries and not any(opened for _, opened in summaries)
    if ran:
        assert summaries[0][0] == "Positive control: details"
        section = browser.find_elements("tag name", "details")[0]
        browser.execute_script("arguments[0].open = true", section)
        assert "toy:planted" in section.text and section.find_elements("tag name", "table")


def test_tables_show_the_run_folders_numbers(report_page):
    run, browser = report_page
    tables = browser.execute_script(
        "return [...document.querySelectorAll('details')].filter(d => d.querySelector('summary').textContent"
        " !== 'Positive control: details').map(d => { d.open = true;"
        " const t = d.querySelector('table'); return [d.querySelector('summary').textContent,"
        " [...t.querySelectorAll('thead th')].map(c => c.innerText.trim()),"
        " [...t.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.innerText.trim()))]; })")
    expected = [(title, pd.read_csv(run / name)) for name, title in TABLES if (run / name).exists()]
    assert [title for title, _ in expected] == [title for title, *_ in tables]
    assert {"Causal k-sweep: top-k heads vs random and layer-matched head sets",
            "Single-head causal scan: each head masked alone",
            "The causal verdict at k* under zero, mean and resample ablation",
            "Cross-masking k-sweep: own, transferred and random heads in each model"} <= {t for t, _ in expected}
    for (title, frame), (_, header, rows) in zip(expected, tables):
        assert header == list(frame.columns), title
        assert len(rows) == len(frame), title
        for index, (row, values) in enumerate(zip(rows, frame.itertuples(index=False))):
            for column, cell, value in zip(frame.columns, row, values):
                assert _matches(cell, value, column), \
                    f"{title}, row {index}, {column}: page shows {cell!r}, CSV has {value!r}"
    # Across tables, from the page alone: masking model A's own top-1 in the cross-masking sweep is the
    # single-head scan's condition for the best-scored head (same model, head and fixed items), so the two
    # tables must agree, and so must their unmasked baselines.
    page = {title: pd.DataFrame(rows, columns=header) for title, header, rows in tables}
    scan = page["Single-head causal scan: each head masked alone"]
    cross = page["Cross-masking k-sweep: own, transferred and random heads in each model"]
    own_in_a = cross[(cross["model"] == "A (toy:a)") & (cross["condition"] == "own")]
    assert own_in_a["k"].tolist() == ["1"]  # k* = 1 on the toy's 32 heads (demo_ks)
    top = scan[scan["score_rank"] == "1"]
    assert own_in_a["accuracy"].tolist() == top["accuracy"].tolist()
    base = float(cross[(cross["model"] == "A (toy:a)") & (cross["condition"] == "baseline")]["accuracy"].iloc[0])
    assert abs(float(top["accuracy"].iloc[0]) + float(top["drop"].iloc[0]) - base) < 2e-3


def test_report_page_screenshot_is_not_blank(report_page):
    """The rendered page has content (a blank or error page would be near uniform)."""
    from PIL import Image

    run, browser = report_page
    shot = run / "report_screenshot.png"  # kept in the run folder for a person to look at
    assert browser.save_screenshot(str(shot))
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape[0] > 100 and pixels.std() > 5
