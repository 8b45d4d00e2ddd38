"""The playground (``/web``) and the run viewer (``/web/runs``) in a real headless Chromium (Debian's ``chromium``
and ``chromium-driver``, driven by Selenium; nothing is downloaded), against a real server and a real eval run.

Screenshots of both pages land in the run's temporary folder (``.../web-screenshots``, printed by the test) and,
when ``MECHSANDBOX_SCREENSHOTS`` names a folder, there too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_harness import running_server

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
PLAN = json.loads((ROOT / "validation" / "runtime.json").read_text())  # dead-neurons easy seed 3 and its answer


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A server whose run viewer shows one folder of runs, with a real scripted eval run in it."""
    runs = tmp_path_factory.mktemp("runs")
    with running_server(tmp_path_factory.mktemp("web"), MECHSANDBOX_RUN_DIRS=str(runs)) as server:
        out = runs / "scripted-dead-neurons"
        cmd = [sys.executable, "-m", "mechsandbox.cli", "eval", "--agent", "scripted", "--tasks", "dead-neurons",
               "--level", "easy", "--split", "train", "--episodes", "3", "--url", server.url,
               "--out", str(out)]  # a train run: the viewer never shows a test run's episodes (issue 55)  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        yield server.url, out


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    if not (CHROMIUM and DRIVER):
        pytest.skip("no chromium and chromedriver: apt-get install chromium chromium-driver (.ci/run does)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    arguments = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,2000")  # noqa: E501
    for arg in arguments:
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return [tmp_path_factory.getbasetemp() / "web-screenshots"] + (
        [Path(os.environ["MECHSANDBOX_SCREENSHOTS"])] if os.environ.get("MECHSANDBOX_SCREENSHOTS") else []
    )


def _screenshot(driver, folders: list[Path], name: str) -> None:
    driver.execute_script("window.scrollTo(0, 0)")
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(folder / name))
        print(f"screenshot: {folder / name}")


def _wait_text(driver, element_id: str, contains: str, timeout: float = 120) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: contains in d.find_element(By.ID, element_id).text)
    return driver.find_element(By.ID, element_id).text


def _start(driver, url: str, family: str, level: str, seed: int, split: str = "train") -> None:
    """Start an episode from the form: ``seed`` is the train seed, or the test index when ``split`` is test."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(f"{url}/web")
    Select(driver.find_element(By.ID, "family")).select_by_value(family)
    Select(driver.find_element(By.ID, "level")).select_by_value(level)
    Select(driver.find_element(By.ID, "split")).select_by_value(split)
    names = ("seed", "index") if split == "train" else ("index", "seed")
    field, other = (driver.find_element(By.ID, name) for name in names)
    assert field.is_displayed() and not other.is_displayed()
    field.clear()
    field.send_keys(str(seed))
    driver.find_element(By.ID, "start").click()
    _wait_text(driver, "status", "episode started")


def _run(driver, code: str) -> object:
    """Type ``code`` into the editor, run it, and return the newest turn once its output arrived."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    before = len(driver.find_elements(By.CSS_SELECTOR, "#log .turn"))
    area = driver.find_element(By.ID, "code")
    driver.execute_script("arguments[0].value = arguments[1];", area, code)  # as typed, without auto-indent games
    driver.find_element(By.ID, "run").click()
    WebDriverWait(driver, 120).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#log .turn")) > before)
    return driver.find_element(By.CSS_SELECTOR, "#log .turn")


def test_the_playground_plays_an_episode_to_a_score(served, browser, shots) -> None:
    from selenium.webdriver.common.by import By

    url, _ = served
    options = PLAN["reset"]["options"]
    _start(browser, url, options["task_id"], options["level"], PLAN["reset"]["seed"])
    assert "dead" in browser.find_element(By.ID, "prompt").text.lower()
    assert '"type"' in browser.find_element(By.ID, "schema").text
    names = [chip.text for chip in browser.find_elements(By.CSS_SELECTOR, "#names .chip")]
    assert "model" in names and "torch" in names
    turn = _run(browser, "print(model)")
    assert "Linear" in turn.text  # dead-neurons' model is an nn.Sequential of Linear layers
    nan = 'float("nan")'
    heat = _run(browser, f'print("@heatmap", json.dumps({{"title": "NaN, Infinity", "z": [[0, 1], [{nan}, 0.5]]}}))')
    assert heat.find_elements(By.CSS_SELECTOR, "canvas.heatmap") and "NaN, Infinity · 2 x 2" in heat.text
    answer = browser.find_element(By.ID, "answer")
    answer.clear()
    answer.send_keys(json.dumps(PLAN["actions"][-1]["solution_target"]))
    browser.find_element(By.ID, "submit").click()
    assert _wait_text(browser, "score", "0.99") == "0.99"
    assert "Truth" in browser.find_element(By.ID, "result").text  # train: the truth and the feedback are shown
    assert browser.find_element(By.ID, "run").get_attribute("disabled")  # the episode is over
    _screenshot(browser, shots, "playground.png")


def test_a_snippet_error_is_an_error_and_markup_in_output_stays_text(served, browser) -> None:
    from selenium.webdriver.common.by import By

    url, _ = served
    _start(browser, url, "dead-neurons", "easy", 1, split="test")
    assert "split test" in browser.find_element(By.ID, "episode-info").text
    failed = _run(browser, "1 / 0")
    assert "ZeroDivisionError" in failed.find_element(By.CSS_SELECTOR, ".snippet-error").text
    hostile = ("<b id='injected'>bold</b><img src=x onerror=\"document.title='pwned'\">"
               "<script>document.title='pwned'</script>")
    turn = _run(browser, f"print({hostile!r})")
    assert hostile in turn.find_element(By.CSS_SELECTOR, "pre.output").text  # shown as the text it is
    assert not browser.find_elements(By.ID, "injected") and browser.title == "MechSandbox playground"
    assert "1" in _run(browser, "print(1)").text  # the page still plays after the error
    browser.find_element(By.ID, "submit").click()  # the example answer; a test episode never shows its truth
    _wait_text(browser, "result", "never shown on the test split")


def test_the_run_viewer_shows_a_real_run_with_the_summarys_numbers(served, browser, shots) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, out = served
    summary = json.loads((out / "summary.json").read_text())
    browser.get(f"{url}/web/runs")
    browser.find_element(By.LINK_TEXT, out.name).click()
    overall = browser.find_element(By.CSS_SELECTOR, "#overall").text
    low, high = summary["overall"]["interval95"]
    assert f"{summary['overall']['mean_score']:.3f} [{low:.3f}, {high:.3f}] (n=3)" in overall
    row = browser.find_element(By.CSS_SELECTOR, '#summary tr[data-family="dead-neurons"]').text
    assert f"{summary['tasks']['dead-neurons']['levels']['easy']['mean_score']:.3f}" in row
    assert len(browser.find_elements(By.CSS_SELECTOR, ".figure img")) == 3
    assert browser.find_element(By.ID, "shown").text == "3 of 3 episodes shown"
    Select(browser.find_element(By.ID, "filter-outcome")).select_by_value("error")
    assert browser.find_element(By.ID, "shown").text == "0 of 3 episodes shown"
    Select(browser.find_element(By.ID, "filter-outcome")).select_by_value("")
    first = browser.find_element(By.CSS_SELECTOR, "details.episode")
    first.find_element(By.TAG_NAME, "summary").click()
    assert "step 1 · python_code" in first.text and "graded: score 0.990" in first.text
    _screenshot(browser, shots, "run-viewer.png")


def test_pages_refuse_bad_names_in_one_line_and_send_a_content_policy(served, tmp_path) -> None:
    url, out = served
    with httpx.Client(base_url=url, timeout=60) as http:
        page = http.get("/web")
        assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
        assert http.get("/web/static/style.css").headers["content-type"].startswith("text/css")
        assert http.get("/web/static/..%2Fpages.py").status_code == 404
        missing = http.get("/web/runs/dir/not-a-run")
        assert missing.status_code == 404 and "no run folder named &#x27;not-a-run&#x27;" in missing.text
        assert http.get("/web/runs/db/run-unknown").status_code == 404
        (out.parent / "broken").mkdir()
        (out.parent / "broken" / "summary.json").write_text("{oops")
        broken = http.get("/web/runs/dir/broken")
        assert broken.status_code == 422 and "not valid JSON" in broken.text
        assert "broken" in http.get("/web/runs").text  # folders are rescanned per request


def test_with_bearer_tokens_only_the_playground_shell_is_open() -> None:
    """The page and its scripts hold no data and load in a browser that cannot send a header; everything else,
    the run viewer and the routes the playground calls included, needs the token."""
    from mechsandbox.server.limits import RequestLimits
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    async def ok(request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    paths = ["/web", "/web/static/style.css", "/web/runs", "/web/runs/dir/x", "/reset", "/webx", "/web/static"]
    app = RequestLimits(Starlette(routes=[Route(p, ok, methods=["GET"]) for p in paths]), 4096, ("tok",), "")
    with TestClient(app) as client:
        status = {p: client.get(p).status_code for p in paths}
        assert status == {"/web": 200, "/web/static/style.css": 200, "/web/runs": 401, "/web/runs/dir/x": 401,
                          "/reset": 401, "/webx": 401, "/web/static": 401}  # fmt: skip
        assert client.get("/web/runs", headers={"Authorization": "Bearer tok"}).status_code == 200
