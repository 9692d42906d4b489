"""The report of a tiny real run, opened in headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which ``make test`` installs): no console error, the curves render,
the episode viewer's filters change what is shown, agent output is shown as text and never
runs. A screenshot of each view goes to ``test-artifacts/report/``.

The run also shows the live view: its TensorBoard scalars are read back from ``tb/``.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_run_config
from report_runs import PAYLOAD

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "report"
AGENTS = ("problem_solver", "code_executor", "verifier")

pytestmark = pytest.mark.integration


def _crafted(step: int, flagged: bool) -> dict[str, Any]:
    """A readable MathChat episode whose every text also carries HTML and script."""

    def act(agent: str, text: str, score: float, **kw: Any) -> dict[str, Any]:
        return {
            "episode_id": f"xss-{step}",
            "agent": agent,
            "turn": 0,
            "prompt_ids": [1, 2, 3],
            "completion_ids": [4, 5, 6, 7],
            "sample_logprobs": [-0.1] * 4,
            "prompt_text": f"<|im_start|>system\nYou are the {agent}.<|im_end|>\n{PAYLOAD}",
            "completion_text": text,
            "truncated": False,
            "tool_observation": kw.get("tool"),
            "tool_status": kw.get("status"),
            "workspace_files": kw.get("files"),
            "coach_reference": None,
            "coach": {
                "value": score,
                "rationale": f"The step is sound and the code prints 17. {PAYLOAD}",
                "answer_correct": kw.get("verdict"),
                "flagged": kw.get("flagged", False),
                "flag_reason": "unparseable" if kw.get("flagged") else "",
                "cached": False,
            },
        }

    code = (
        "Let me compute it.\n```python\n# apples Ava has\ntotal = 12 + 5\n"
        "print(f'total = {total}')\n```\n" + PAYLOAD
    )
    return {
        "episode_id": f"xss-{step}",
        "task_id": "xss-demo",
        "task": f"Ava has 12 apples. Then she gets 5 more. How many now? {PAYLOAD}",
        "answer": "17",
        "step": step,
        "task_type": "arithmetic",
        "actions": [
            act("problem_solver", f"12 + 5 = 17 apples. {PAYLOAD}", 8.0),
            act(
                "code_executor",
                code,
                9.0,
                tool=f"total = 17\n{PAYLOAD}",
                status="ok",
                files="(no files)",
            ),
            act(
                "verifier", "The code confirms it: \\boxed{17}", 9.8, verdict=True, flagged=flagged
            ),
        ],
        "final_answer": "17",
        "correct": True,
    }


@pytest.fixture(scope="module")
def report(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real 2-step run of the tiny model, two crafted episodes added; its report."""
    from mappa.cli import main
    from mappa.run.loop import train

    root = tmp_path_factory.mktemp("report")
    run_dir = train(
        tiny_run_config(tiny_model_dir, root / "run", "eval.every=1", "eval.num_tasks=2")
    )
    with (run_dir / "episodes.jsonl").open("a") as fh:
        for step in (0, 1):
            fh.write(json.dumps(_crafted(step, flagged=step == 1)) + "\n")
    assert main(["report", str(run_dir), "--out", str(root / "report")]) == 0
    return run_dir, root / "report" / "index.html"


def _tb_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files (TFRecord framing: length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_training_writes_tensorboard_scalars(report: tuple[Path, Path]) -> None:
    run_dir, _ = report
    scalars = _tb_scalars(run_dir / "tb")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for key in ("coach/verifier", "rl/code_executor/clip_frac", "rollout_s", "eval/accuracy"):
        assert [s for s, _ in scalars[key]] == [0, 1], key
        assert scalars[key][-1][1] == pytest.approx(metrics[-1][key], rel=1e-6), key


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("chromium / chromium-driver not installed (make install-browser)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: Any, name: str) -> None:
    """A screenshot of the whole page, beyond the window (Chrome DevTools), up to 4000 px."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 4000)}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {"format": "png", "captureBeyondViewport": True, "clip": {**clip, "scale": 1}},
    )
    (ARTIFACTS / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))


def _console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_report_in_chromium(report: tuple[Path, Path], browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    run_dir, page = report
    driver = browser
    driver.get(page.as_uri())
    wait = WebDriverWait(driver, 20)

    # Curves: real charts, drawn, labelled, one line per agent with a legend.
    charts = driver.find_elements(By.CSS_SELECTOR, "#view-curves .chart svg")
    assert len(charts) >= 10
    assert all(c.size["height"] > 100 and c.size["width"] > 200 for c in charts)
    first = charts[0].get_attribute("textContent") or ""
    assert "coach score per agent" in first and "step" in first
    assert all(agent in first for agent in AGENTS)  # the legend
    _shot(driver, "curves")

    # Coach statistics.
    driver.find_element(By.CSS_SELECTOR, "nav button[data-view=coach]").click()
    coach = driver.find_element(By.ID, "view-coach")
    assert coach.is_displayed() and "final agent's score vs the true outcome" in coach.text
    assert coach.find_elements(By.CSS_SELECTOR, ".chart svg")
    _shot(driver, "coach")

    # Episode viewer: the last step opens, with every episode of it.
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    last = [e for e in episodes if e["step"] == 1]
    driver.find_element(By.CSS_SELECTOR, "nav button[data-view=episodes]").click()

    def shown() -> int:
        wait.until(lambda d: "showing" in d.find_element(By.ID, "ep-summary").text)
        text = driver.find_element(By.ID, "ep-summary").text
        match = re.search(r"step 1: showing (\d+) of (\d+)", text)
        assert match, text
        assert int(match.group(2)) == len(last)
        count = len(driver.find_elements(By.CSS_SELECTOR, "#ep-list details.episode"))
        assert count == int(match.group(1))
        return count

    assert shown() == len(last)

    def scores(e: dict[str, Any]) -> list[dict[str, Any]]:
        return [a["coach"] for a in e["actions"] if a["coach"]]

    outcome = Select(driver.find_element(By.ID, "f-outcome"))
    outcome.select_by_value("right")
    assert shown() == sum(e["correct"] is True for e in last) >= 1
    outcome.select_by_value("wrong")
    assert shown() == sum(e["correct"] is False for e in last)
    outcome.select_by_value("")
    flagged = Select(driver.find_element(By.ID, "f-flagged"))
    flagged.select_by_value("yes")
    assert shown() == sum(any(s["flagged"] for s in scores(e)) for e in last) >= 1
    flagged.select_by_value("")
    low = driver.find_element(By.ID, "f-min")
    low.clear()
    low.send_keys("9.5")
    assert shown() == sum(any(s["value"] >= 9.5 for s in scores(e)) for e in last) >= 1
    low.clear()
    low.send_keys("0")
    assert shown() == len(last)
    Select(driver.find_element(By.ID, "f-agent")).select_by_value("code_executor")
    crafted = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "details[data-episode=xss-1]"))
    crafted.find_element(By.TAG_NAME, "summary").click()
    # the body is built on the "toggle" event, which fires after the click returns
    actions = wait.until(lambda d: crafted.find_elements(By.CSS_SELECTOR, ".action"))
    assert [a.get_attribute("data-agent") for a in actions] == ["code_executor"]
    assert actions[0].find_elements(By.CSS_SELECTOR, "pre.code span.kw, pre.code span.fn")

    # Agent text, tool output and rationales show as text and never run.
    body = crafted.text
    assert "<script>window.__pwned = 1</script>" in body and "<b>bold</b>" in body
    assert driver.execute_script("return window.__pwned") is None
    assert not driver.find_elements(By.CSS_SELECTOR, "#ep-list img, #ep-list b")
    Select(driver.find_element(By.ID, "f-agent")).select_by_value("")
    outcome.select_by_value("right")  # the readable episode alone, opened: docs/report.md's picture
    crafted = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "details[data-episode=xss-1]"))
    if crafted.get_attribute("open") is None:  # a tiny-model episode that happened to be right
        crafted.find_element(By.TAG_NAME, "summary").click()
    wait.until(lambda d: len(crafted.find_elements(By.CSS_SELECTOR, ".action")) == 3)
    driver.execute_script("window.scrollTo(0, 0)")
    _shot(driver, "episodes")

    # The same task across steps, side by side.
    crafted.find_element(By.CSS_SELECTOR, "summary button.link").click()
    wait.until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#compare-panel .col details.episode")) == 2
    )
    columns = driver.find_elements(By.CSS_SELECTOR, "#compare-panel .col")
    assert [c.find_element(By.TAG_NAME, "strong").text for c in columns] == ["step 0", "step 1"]
    _shot(driver, "compare")

    # The held-out episodes (eval.every=1) are a set of their own.
    outcome.select_by_value("")
    Select(driver.find_element(By.ID, "f-run")).select_by_visible_text("run (held-out)")
    wait.until(lambda d: "step 1: showing 2 of 2" in d.find_element(By.ID, "ep-summary").text)

    assert driver.execute_script("return window.__pwned") is None
    assert _console_errors(driver) == []
