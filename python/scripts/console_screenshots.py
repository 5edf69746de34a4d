"""Draws the screenshots of the console's main pages in `docs/console/`: a kernel with its
console, the demo worker, the demo agent's quickstart run, a refund waiting for approval, and a
branch of the first run; then each page in headless Chromium.

    cargo build --workspace --bins --examples
    python3 python/scripts/console_screenshots.py

Needs Selenium and Chromium with ChromeDriver on PATH (as the console's tests do)."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "tests"))

from harness import WAIT, Kernel, Process, binary  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from kernel_sdk import AgentClient  # noqa: E402

OUT = REPO / "docs" / "console"


def demo_agent(kernel: Kernel, *args: str) -> Process:
    return Process(
        [str(binary("demo-agent")), "--kernel", f"http://{kernel.addr}", *args], "demo agent"
    )


async def main() -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        sys.exit("console_screenshots: Chromium and ChromeDriver must be on PATH")
    with tempfile.TemporaryDirectory() as folder:
        kernel = Kernel(Path(folder), "--http-listen", "127.0.0.1:0")
        worker = Process(
            [str(binary("demo-worker")), "--kernel", f"http://{kernel.addr}", "--root", str(REPO)],
            "demo worker",
        )
        try:
            worker.wait_for("worker session open")
            first = demo_agent(kernel)
            assert first.process.wait(timeout=WAIT) == 0, first.log()
            run_id = first.lines[-1].strip()
            # A refund waits for a person: the approvals page has something to show.
            waiting = demo_agent(kernel, "--scenario", "refund")
            async with AgentClient(kernel.addr) as client:
                for _ in range(100):
                    if await client.list_approvals():
                        break
                    await asyncio.sleep(0.1)
                branch = await client.fork_run(run_id)
            shoot(kernel, chromium, driver_path, run_id, branch.id)
            waiting.stop()
        finally:
            worker.stop()
            kernel.stop()


def shoot(kernel: Kernel, chromium: str, driver_path: str, run_id: str, branch_id: str) -> None:
    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    OUT.mkdir(parents=True, exist_ok=True)
    pages = [
        ("runs", "/runs", "table"),
        ("run", f"/runs/{run_id}", "details.step"),
        ("approvals", "/approvals", "form"),
        ("tools", "/registry", "table.tools"),
        ("compare", f"/compare?a={run_id}&b={branch_id}", "table.compare"),
    ]
    try:
        for name, path, shows in pages:
            driver.get(f"http://{kernel.http}{path}")
            WebDriverWait(driver, 10).until(lambda d, s=shows: d.find_elements(By.CSS_SELECTOR, s))
            if name == "run":
                # The first call opened, to show what a step holds.
                driver.find_element(By.CSS_SELECTOR, "details.step summary").click()
            driver.save_screenshot(str(OUT / f"{name}.png"))
            print(f"docs/console/{name}.png")
    finally:
        driver.quit()


if __name__ == "__main__":
    asyncio.run(main())
