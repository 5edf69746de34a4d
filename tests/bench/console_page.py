"""How long a console page takes to open in headless Chromium, as a visitor sees it: from the
request to the page drawn and its script run (Navigation Timing's `loadEventEnd`), the median and
range over N loads. `kernelctl bench --sections replay --console URL` makes a 10,000-step run
and times its pages over HTTP; this adds the browser's own parse, layout and script.

    python3 tests/bench/console_page.py http://127.0.0.1:8080/runs/RUN_ID [ROUNDS]

Needs Selenium (`pip install selenium`) and Chromium with ChromeDriver on PATH."""

from __future__ import annotations

import shutil
import statistics
import sys

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

# Read once the load event has ended: WebDriver may hand back the page while its handlers run.
TIMING = """
const done = arguments[arguments.length - 1];
function read() {
  const [n] = performance.getEntriesByType("navigation");
  if (!n || n.loadEventEnd === 0) return setTimeout(read, 5);
  done([n.responseEnd, n.domContentLoadedEventEnd, n.loadEventEnd, n.transferSize]);
}
read();
"""


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        sys.exit("console_page: Chromium and ChromeDriver must be on PATH")
    options = Options()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        options=options, service=Service(executable_path=driver_path)
    )
    try:
        driver.get(
            url
        )  # warm up: the stylesheet and script cached, as on a second visit
        samples = []
        for _ in range(rounds):
            driver.get(url)
            samples.append(driver.execute_async_script(TIMING))
    finally:
        driver.quit()
    for name, index in (("response", 0), ("dom ready", 1), ("loaded", 2)):
        values = sorted(sample[index] for sample in samples)
        print(
            f"{name:<10} p50 {statistics.median(values):7.1f} ms"
            f"  range {values[0]:.1f}-{values[-1]:.1f} ms"
        )
    print(f"{'bytes':<10} {samples[-1][3]}  over {rounds} loads of {url}")


if __name__ == "__main__":
    main()
