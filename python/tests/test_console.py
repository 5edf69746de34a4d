"""The web console in a real headless browser (Debian's Chromium and ChromeDriver, driven by
Selenium): the runs list, a run's steps and live progress, an approval answered from the page,
capture levels, a budget raised from the approvals page, the limits page, and a kernel with keys
that shows nothing without one. Screenshots go to `target/console-screenshots/`.

Without Chromium these tests say why and skip, unless `KERNEL_REQUIRE_BROWSER=1` (which `.ci/run`
sets): then they fail."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hosted_agents
import pydantic
import pytest
from conftest import ended_run, serving
from harness import REPO, WAIT, Kernel, Process, binary
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from kernel_sdk import (
    AgentClient,
    AgentContext,
    BudgetLimit,
    CallOutcome,
    KernelError,
    ToolCall,
    ToolContext,
    agent,
    tool,
)

SCREENSHOTS = REPO / "target" / "console-screenshots"


# What Chromium says when a command meets a document that a navigation (a form's submit, the
# page's own refresh) has replaced under it: reported as an unknown error, not a stale element.
DOCUMENT_SWAPPED = (
    "does not belong to the document",
    "Execution context was destroyed",
    "Cannot find context with specified id",
    "document unloaded",
)


def swapped_document_is_a_miss(check: Callable[[WebDriver], Any], driver: WebDriver) -> Any:
    """One poll of a wait: a document swapped mid-check is a miss, and the next poll reads the
    new one; any other error is the test's."""
    try:
        return check(driver)
    except WebDriverException as error:
        if any(fragment in str(error) for fragment in DOCUMENT_SWAPPED):
            return False
        raise


class Browser:
    """A headless Chromium on one kernel's HTTP listener; every wait polls the page, never a
    clock alone."""

    def __init__(self, driver: WebDriver, base: str, name: str) -> None:
        self.driver = driver
        self.base = base
        self.name = name

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def until(self, what: str, check: Callable[[WebDriver], Any]) -> Any:
        try:
            # The live part of a run's page is replaced as the run changes: an element found
            # just before is then stale, and the next poll finds the new one.
            wait = WebDriverWait(
                self.driver,
                WAIT,
                poll_frequency=0.1,
                ignored_exceptions=[NoSuchElementException, StaleElementReferenceException],
            )
            return wait.until(lambda driver: swapped_document_is_a_miss(check, driver))
        except Exception as error:
            self.shot("failed")
            # Read like a poll, so a page replaced at this moment cannot hide what was waited for.
            shows = swapped_document_is_a_miss(lambda _: self.text(), self.driver)
            raise AssertionError(
                f"the page never showed {what}; it shows:\n{(shows or '(a page being replaced)')[:3000]}"
            ) from error

    def text(self) -> str:
        # One script, not a find and then a read: a form's submit swaps the document, and a body
        # found just before it is gone by the read (Chromium reports that as an unknown error,
        # "Node with given id does not belong to the document", not as a stale element).
        return str(
            self.driver.execute_script("return document.body ? document.body.innerText : ''")
        )

    def source(self) -> str:
        return str(self.driver.page_source)

    def shot(self, label: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{self.name}-{label}.png"
        self.driver.save_screenshot(str(path))
        return path


@pytest.fixture
def chrome(request: pytest.FixtureRequest) -> Iterator[Callable[[Kernel], Browser]]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        reason = "Chromium is not installed (Debian: apt-get install chromium chromium-driver)"
        if os.environ.get("KERNEL_REQUIRE_BROWSER") == "1":
            pytest.fail(f"KERNEL_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(f"SKIPPED {request.node.name}: {reason}")
    options = Options()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    started: list[WebDriver] = []

    def start(kernel: Kernel) -> Browser:
        assert kernel.http, "the kernel was started without --http-listen"
        driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
        started.append(driver)
        return Browser(driver, f"http://{kernel.http}", request.node.name)

    yield start
    for driver in started:
        driver.quit()


def console_kernel(tmp_path: Path, *args: str) -> Kernel:
    return Kernel(tmp_path, "--http-listen", "127.0.0.1:0", *args)


def demo_run(kernel: Kernel) -> str:
    """The demo worker and the demo agent, as the README's quickstart runs them; the run's id."""
    worker = Process(
        [str(binary("demo-worker")), "--kernel", f"http://{kernel.addr}", "--root", str(REPO)],
        "demo worker",
    )
    try:
        worker.wait_for("worker session open")
        agent = Process(
            [str(binary("demo-agent")), "--kernel", f"http://{kernel.addr}"], "demo agent"
        )
        assert agent.process.wait(timeout=WAIT) == 0, agent.log()
        agent.wait_for("completed")
        return agent.lines[-1].strip()
    finally:
        worker.stop()


async def test_the_runs_list_shows_the_demo_agents_run_and_its_page_its_steps(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        run_id = await asyncio.to_thread(demo_run, kernel)
        browser = await asyncio.to_thread(chrome, kernel)

        def check() -> None:
            browser.open("/runs")
            row = browser.until(
                "the demo run in the list",
                lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-run="{run_id}"]'),
            )
            assert "demo-agent" in row.text and "completed" in row.text
            browser.shot("runs")
            # Without keys there is no session to leave.
            assert not browser.driver.find_elements(By.CSS_SELECTOR, "form.logout")
            row.find_element(By.CSS_SELECTOR, "a").click()
            browser.until(
                "the run's steps", lambda d: d.find_elements(By.CSS_SELECTOR, "details.step")
            )
            steps = browser.driver.find_elements(By.CSS_SELECTOR, "details.step")
            names = [s.find_element(By.CSS_SELECTOR, ".name").text for s in steps]
            assert names == ["add", "echo", "slow", "weather", "add"], names
            assert "unknown_tool" in steps[3].text and "invalid_arguments" in steps[4].text
            # Each ran step has a bar per attempt, coloured by how it ended.
            assert steps[2].find_elements(By.CSS_SELECTOR, ".bar.attempt.ok")
            steps[0].click()
            browser.until("the step's arguments", lambda d: '"a": 2' in steps[0].text)
            assert "demo-worker" in steps[0].text
            events = browser.driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")
            assert events and "run:created" in events[0].text and "run:completed" in events[-1].text
            # A payload is one line until opened, then indented, with a button that copies it.
            payload = events[0].find_element(By.CSS_SELECTOR, "details.payload")
            payload.find_element(By.CSS_SELECTOR, "summary").click()
            browser.until("the payload indented", lambda d: '"agent": "demo-agent"' in payload.text)
            assert payload.find_element(By.CSS_SELECTOR, "button.copy").is_displayed()
            browser.shot("run")
            # A filter that matches nothing shows nothing of it.
            browser.open("/runs?status=failed")
            browser.until("the empty list", lambda d: "No runs match." in browser.text())
            assert run_id not in browser.source()
            browser.open("/registry")
            browser.until(
                "the demo tools", lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-tool="slow"]')
            )

        await asyncio.to_thread(check)
    finally:
        kernel.stop()


gate = asyncio.Event()


@tool
async def crawl(ctx: ToolContext, pages: int) -> dict[str, int]:
    """Reports progress until it is let go: progress is never logged, so a page that opens
    after a report sees the next one."""
    page = 0
    while not gate.is_set():
        page = min(page + 1, pages)
        ctx.progress(f"crawled page {page}", current=page, total=pages)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gate.wait(), 0.2)
    return {"pages": pages}


async def test_a_run_page_follows_a_live_calls_progress_and_its_end(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    gate.clear()
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, crawl):
            run = await client.create_run("crawler")
            turn = asyncio.create_task(
                client.call_turn(run.id, 0, [ToolCall("crawl", {"pages": 3})])
            )
            browser = await asyncio.to_thread(chrome, kernel)
            await asyncio.to_thread(browser.open, f"/runs/{run.id}")
            # The page opened while the call runs; what it reported arrives live.
            await asyncio.to_thread(
                browser.until,
                "the call's progress",
                lambda d: (
                    "crawled page 3" in d.find_element(By.CSS_SELECTOR, "[data-progress]").text
                ),
            )
            progress = browser.driver.find_element(By.CSS_SELECTOR, "[data-progress] progress")
            assert progress.get_attribute("value") == "3" and progress.get_attribute("max") == "3"
            trace = browser.driver.find_element(By.ID, "run-trace").text
            assert trace == run.trace_id, "the header names the run's trace"
            await asyncio.to_thread(browser.shot, "running")
            gate.set()
            [result] = (await turn).results
            assert result.outcome == CallOutcome.OK
            await client.complete_run(run.id, {"done": True})
            await asyncio.to_thread(
                browser.until,
                "the run completed",
                lambda d: d.find_element(By.ID, "run-status").text == "completed",
            )
            rows = browser.driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")
            kinds = [r.find_elements(By.TAG_NAME, "td")[2].text for r in rows]
            assert kinds[-3:] == ["tool:start", "tool:result", "run:completed"], kinds
            seqs = [int(r.get_attribute("data-seq") or 0) for r in rows]
            assert seqs == list(range(1, len(seqs) + 1)), "the live tail skipped or repeated events"
            step = browser.driver.find_element(By.CSS_SELECTOR, "details.step")
            assert step.get_attribute("data-status") == "succeeded"
    finally:
        gate.set()
        kernel.stop()


ran: list[int] = []


@tool(requires_approval=True)
async def refund(ctx: ToolContext, cents: int) -> dict[str, int]:
    """Refunds a customer."""
    ran.append(cents)
    return {"refunded": cents}


async def test_an_approval_is_answered_from_the_page_and_the_call_runs(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    ran.clear()
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, refund):
            run = await client.create_run("support")
            turn = asyncio.create_task(
                client.call_turn(run.id, 0, [ToolCall("refund", {"cents": 1234})])
            )
            browser = await asyncio.to_thread(chrome, kernel)

            def approve() -> None:
                browser.open("/approvals")
                card = browser.until(
                    "the waiting approval",
                    lambda d: d.find_element(By.CSS_SELECTOR, "article.approval"),
                )
                assert "refund" in card.text and '"cents": 1234' in card.text
                browser.shot("waiting")
                card.find_element(By.NAME, "decider").send_keys("alice")
                card.find_element(By.NAME, "reason").send_keys("customer is right")
                card.find_element(By.CSS_SELECTOR, "button.approve").click()
                browser.until("an empty list", lambda d: "Nothing waits" in browser.text())

            await asyncio.to_thread(approve)
            [result] = (await turn).results
            assert result.outcome == CallOutcome.OK and result.output == {"refunded": 1234}
            assert ran == [1234]
            [answered] = await client.list_approvals(run_id=run.id, status="consumed")
            assert answered.status == "consumed"
            assert answered.decider == "alice" and answered.reason == "customer is right"
    finally:
        kernel.stop()


@tool
async def release(ctx: ToolContext, version: str) -> dict[str, object]:
    """Releases once a person says how."""
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "channel": {"type": "string"}},
        "required": ["ok"],
    }
    answer = await ctx.ask(f"Release {version}?", schema=schema)
    return {"released": version, **answer}


async def test_a_tools_question_is_answered_from_a_form_made_from_its_schema_or_as_checked_json(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, release):
            run = await client.create_run("releaser")
            turn = asyncio.create_task(
                client.call_turn(run.id, 0, [ToolCall("release", {"version": "4.2"})])
            )
            browser = await asyncio.to_thread(chrome, kernel)

            def card() -> Any:
                browser.open("/approvals")
                found = browser.until(
                    "the waiting question",
                    lambda d: d.find_element(By.CSS_SELECTOR, "article.approval"),
                )
                assert "Release 4.2?" in found.text and '"channel"' in found.text, found.text
                found.find_element(By.NAME, "decider").send_keys("alice")
                return found

            def answer_as_json(text: str) -> None:
                found = card()
                found.find_element(By.CSS_SELECTOR, "details.json summary").click()
                found.find_element(By.NAME, "answer_json").send_keys(text)
                found.find_element(By.CSS_SELECTOR, "button.approve").click()

            def answer_with_the_form() -> None:
                # The schema's form: yes or no for `ok`, a text field for `channel`.
                found = card()
                found.find_element(By.CSS_SELECTOR, 'input[name="field:ok"][value="true"]').click()
                found.find_element(By.NAME, "field:channel").send_keys("stable")
                browser.shot("question-form")
                found.find_element(By.CSS_SELECTOR, "button.approve").click()

            # An answer that does not meet the schema is refused, and the question still waits.
            await asyncio.to_thread(answer_as_json, '{"ok": "sure"}')
            await asyncio.to_thread(
                browser.until,
                "the refusal naming the field",
                lambda d: "answer_json" in browser.text(),
            )
            assert len(await client.list_approvals(run_id=run.id)) == 1
            await asyncio.to_thread(answer_with_the_form)
            await asyncio.to_thread(
                browser.until, "an empty list", lambda d: "Nothing waits" in browser.text()
            )
            [result] = (await turn).results
            assert result.outcome == CallOutcome.OK, result
            assert result.output == {"released": "4.2", "ok": True, "channel": "stable"}
            [answered] = await client.list_approvals(run_id=run.id, status="approved")
            assert answered.decider == "alice"
            assert answered.answer == {"ok": True, "channel": "stable"}
    finally:
        kernel.stop()


@tool
async def lookup(ctx: ToolContext, secret: str) -> dict[str, str]:
    """Looks a secret up."""
    return {"found": secret[::-1]}


async def test_capture_none_hides_arguments_and_results_on_the_page(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, lookup):
            run = await client.create_run("private", capture="none", input={"ssn": "078-05-1120"})
            await client.call_turn(run.id, 0, [ToolCall("lookup", {"secret": "hunter2-swordfish"})])
            browser = await asyncio.to_thread(chrome, kernel)

            def check() -> None:
                browser.open(f"/runs/{run.id}")
                step = browser.until(
                    "the step", lambda d: d.find_element(By.CSS_SELECTOR, "details.step")
                )
                step.click()
                browser.until("the step's detail", lambda d: "Arguments" in step.text)
                source = browser.source()
                for secret in ("hunter2-swordfish", "hsifdrows-2retnuh", "078-05-1120"):
                    assert secret not in source, f"{secret} shown at capture none"
                assert "capture=none" in source
                browser.shot("capture-none")

            await asyncio.to_thread(check)
    finally:
        kernel.stop()


@tool(cost_per_call=0.5)
async def priced(n: int) -> int:
    """Doubles `n`, at a price."""
    return 2 * n


async def test_a_runs_page_shows_its_budget_with_what_it_spent(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, priced):
            run = await client.create_run(
                "budgeted", budget=[BudgetLimit(max_calls=3, max_cost=1.0)]
            )
            calls = [ToolCall("priced", {"n": n}) for n in range(3)]
            turn = await client.call_turn(run.id, 0, calls)
            assert [r.outcome for r in turn.results][-1] == CallOutcome.BUDGET_EXCEEDED
            browser = await asyncio.to_thread(chrome, kernel)

            def check() -> None:
                browser.open(f"/runs/{run.id}")
                budget = browser.until("the budget", lambda d: d.find_element(By.ID, "run-budget"))
                assert budget.text == "calls 2 of 3, cost 1.00 of 1.00 (request)", budget.text
                steps = browser.source()
                assert "budget_exceeded" in steps
                browser.shot("run-budget")

            await asyncio.to_thread(check)
    finally:
        kernel.stop()


ASKING = """
default: allow
budgets:
  - max_calls: 1
    approval: { approvers: [finance] }
limits:
  - tools: "pri*"
    per_second: 50
    at_once: 2
fair_shares:
  label: tenant
  weights: { acme: 4 }
"""


async def test_a_budget_is_raised_from_the_approvals_page_and_limits_and_shares_have_a_page(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(ASKING)
    kernel = console_kernel(tmp_path, "--policy", str(policy))
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, priced):
            run = await client.create_run("budgeted", labels={"tenant": "acme"})
            first = await client.call_turn(run.id, 0, [ToolCall("priced", {"n": 1})])
            assert first.results[0].ok, first.results
            turn = asyncio.create_task(client.call_turn(run.id, 1, [ToolCall("priced", {"n": 2})]))
            browser = await asyncio.to_thread(chrome, kernel)

            def raise_it() -> None:
                browser.open("/approvals")
                card = browser.until(
                    "the budget's approval",
                    lambda d: d.find_element(By.CSS_SELECTOR, "article.approval"),
                )
                assert "budget exceeded: calls 2 of 1" in card.text, card.text
                assert "max_calls" in card.text, "the new limit's schema is shown"
                browser.shot("budget-approval")
                card.find_element(By.NAME, "decider").send_keys("finance")
                card.find_element(By.NAME, "answer_json").send_keys('{"max_calls": 2}')
                card.find_element(By.CSS_SELECTOR, "button.approve").click()
                browser.until("an empty list", lambda d: "Nothing waits" in browser.text())

            await asyncio.to_thread(raise_it)
            [result] = (await turn).results
            assert result.ok and result.output == 4, result
            detail = await client.get_run(run.id)
            assert detail.run.budget[0].set_by == "policy:budgets[0], raised by finance"

            def limits() -> None:
                browser.open("/limits")
                row = browser.until(
                    "the limit's row",
                    lambda d: d.find_element(By.CSS_SELECTOR, 'tr[data-limit="pri*"]'),
                )
                tools, rate, burst, at_once, running, tokens, waiting = row.text.split()
                assert (tools, rate, burst, at_once, running, waiting) == (
                    "pri*",
                    "50/s",
                    "50",
                    "2",
                    "0",
                    "0",
                ), row.text
                assert 0 <= float(tokens) <= 50, row.text
                share = browser.driver.find_element(By.CSS_SELECTOR, 'tr[data-share="acme"]')
                assert share.text.split() == ["acme", "4", "0"], share.text
                assert "tenant" in browser.text()
                browser.shot("limits")

            await asyncio.to_thread(limits)
    finally:
        kernel.stop()


SECRET = "console-test-reader-key"


def auth_file(folder: Path) -> Path:
    path = folder / "auth.yaml"
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    path.write_text(
        "keys:\n"
        f"  - name: reader\n    sha256: {digest}\n    scopes: [runs:read]\n"
        f"  - name: admin\n    sha256: {hashlib.sha256(b'admin-key').hexdigest()}\n"
        "    scopes: [admin]\n"
    )
    return path


async def test_without_a_key_the_console_shows_nothing(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path, "--auth-file", str(auth_file(tmp_path)))
    try:
        async with AgentClient(kernel.addr, api_key="admin-key") as client:
            run = await client.create_run("guarded", labels={"team": "secret-team"})
        browser = await asyncio.to_thread(chrome, kernel)

        def check() -> None:
            for path in ("/runs", "/approvals", "/registry", "/limits", f"/runs/{run.id}"):
                browser.open(path)
                browser.until("the key form", lambda d: d.find_elements(By.NAME, "key"))
                # The form names the page to come back to; nothing of the run is shown.
                assert run.id not in browser.text() and "secret-team" not in browser.source()
            browser.shot("login")
            browser.driver.find_element(By.NAME, "key").send_keys("not-a-key\n")
            browser.until("the refusal", lambda d: "not known" in browser.text())
            assert run.id not in browser.text() and "secret-team" not in browser.source()
            browser.driver.find_element(By.NAME, "key").send_keys(SECRET + "\n")
            # Back where it was sent from, now with the key.
            browser.until("the run's page", lambda d: run.id in browser.text())
            browser.open("/runs")
            browser.until("the run in the list", lambda d: "secret-team" in browser.text())
            # The limits page is an admin's, as `kernelctl limits` is: a reader is refused.
            browser.open("/limits")
            browser.until("the refusal", lambda d: "admin" in browser.text())
            assert "Tool limits" not in browser.text()
            browser.open("/runs")
            browser.until("the run in the list", lambda d: "secret-team" in browser.text())
            browser.driver.find_element(By.CSS_SELECTOR, "form.logout button").click()
            # The log-out lands on the key form; opening a page before it has would cancel it.
            browser.until(
                "the key form after logging out", lambda d: d.find_elements(By.NAME, "key")
            )
            browser.open("/runs")
            browser.until("the key form again", lambda d: d.find_elements(By.NAME, "key"))

        await asyncio.to_thread(check)
        # The stream and the metrics refuse a client without the key too.
        for path in (f"/runs/{run.id}/stream", f"/runs/{run.id}/live", "/metrics"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                await asyncio.to_thread(urllib.request.urlopen, f"http://{kernel.http}{path}")
            assert refused.value.code == 401, path
    finally:
        kernel.stop()


@tool
async def add_up(ctx: ToolContext, a: int, b: int) -> int:
    """Adds."""
    return a + b


@tool
async def hold_on(ctx: ToolContext) -> str:
    """Runs until it is cancelled."""
    await ctx.cancelled.wait()
    return "let go"


def confirm_and_do(browser: Browser, form: str, what: str) -> None:
    """Submits the action form `form` of the page, then its confirmation page's yes."""
    browser.until(f"the {what} form", lambda d: d.find_element(By.CSS_SELECTOR, form))
    browser.driver.find_element(By.CSS_SELECTOR, f"{form} button[type=submit]").click()
    browser.until(f"the {what} confirmation", lambda d: "No, go back" in browser.text())
    browser.shot(f"confirm-{what.replace(' ', '-')}")
    browser.driver.find_element(By.CSS_SELECTOR, "form.confirm button.danger").click()


def open_step(browser: Browser, key: str) -> Any:
    step = browser.until(
        f"step {key}", lambda d: d.find_element(By.CSS_SELECTOR, f'details.step[data-key="{key}"]')
    )
    if step.get_attribute("open") is None:
        step.find_element(By.CSS_SELECTOR, "summary").click()
    return step


async def test_a_call_and_a_run_are_cancelled_forked_and_deleted_from_the_page_each_confirmed(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, add_up, hold_on):
            run = await client.create_run("acted-on")
            await client.call_turn(run.id, 0, [ToolCall("add_up", {"a": 1, "b": 2})])
            held = asyncio.create_task(client.call_turn(run.id, 1, [ToolCall("hold_on", {})]))
            browser = await asyncio.to_thread(chrome, kernel)

            def cancel_the_call() -> None:
                browser.open(f"/runs/{run.id}")
                step = open_step(browser, "t1/p0")
                browser.until("the call running", lambda d: "running" in step.text)
                confirm_and_do(
                    browser, 'details.step[data-key="t1/p0"] form.cancel-call', "cancel call"
                )
                browser.until(
                    "the call cancelled",
                    lambda d: (
                        "cancelled"
                        in d.find_element(
                            By.CSS_SELECTOR, 'details.step[data-key="t1/p0"] .status'
                        ).text
                    ),
                )

            await asyncio.to_thread(cancel_the_call)
            [cancelled] = (await held).results
            assert cancelled.outcome == CallOutcome.CANCELLED, cancelled

            def fork_with_a_new_result() -> str:
                browser.open(f"/runs/{run.id}")
                step = open_step(browser, "t0/p0")
                form = step.find_element(By.CSS_SELECTOR, "form.fork-here")
                form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
                # The result is replaced on the confirmation page, not in each step.
                browser.until(
                    "the fork's confirmation",
                    lambda d: "Replay t0/p0 with this result instead" in browser.text(),
                )
                confirm = browser.driver.find_element(By.CSS_SELECTOR, "form.confirm")
                confirm.find_element(By.NAME, "result").send_keys("42")
                confirm.find_element(By.CSS_SELECTOR, "button.danger").click()
                browser.until(
                    "the branch's page",
                    lambda d: "/runs/" in d.current_url and run.id not in d.current_url,
                )
                return str(browser.driver.current_url.rsplit("/", 1)[-1])

            branch_id = await asyncio.to_thread(fork_with_a_new_result)
            branch = (await client.get_run(branch_id)).run
            assert branch.forked_from_run_id == run.id, branch
            assert branch.fork_at_step_key == "t0/p0"
            [replayed] = (
                await client.call_turn(branch_id, 0, [ToolCall("add_up", {"a": 1, "b": 2})])
            ).results
            assert replayed.output == 42, "the branch replays the result the form put there"

            def cancel_then_delete_the_run() -> None:
                browser.open(f"/runs/{run.id}")
                assert not browser.driver.find_elements(By.CSS_SELECTOR, "form.delete-run")
                confirm_and_do(browser, "form.cancel-run", "cancel run")
                browser.until(
                    "the run cancelled",
                    lambda d: d.find_elements(By.CSS_SELECTOR, "form.delete-run"),
                )
                assert "cancelled" in browser.text()
                confirm_and_do(browser, "form.delete-run", "delete run")
                browser.until("the runs list", lambda d: d.current_url.endswith("/runs"))
                assert run.id not in browser.source()

            await asyncio.to_thread(cancel_then_delete_the_run)
            with pytest.raises(KernelError) as gone:
                await client.get_run(run.id)
            assert gone.value.code == "NOT_FOUND"
    finally:
        kernel.stop()


async def test_a_read_only_key_sees_no_action_and_its_forged_posts_are_refused(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path, "--auth-file", str(auth_file(tmp_path)))
    try:
        async with AgentClient(kernel.addr, api_key="admin-key") as client:
            run = await client.create_run("guarded")
            browser = await asyncio.to_thread(chrome, kernel)

            def reader_sees_no_forms() -> None:
                browser.open(f"/runs/{run.id}")
                browser.until("the key form", lambda d: d.find_elements(By.NAME, "key"))
                browser.driver.find_element(By.NAME, "key").send_keys(SECRET + "\n")
                browser.until("the run's page", lambda d: run.id in browser.text())
                assert not browser.driver.find_elements(By.CSS_SELECTOR, "form.action")

            await asyncio.to_thread(reader_sees_no_forms)
            actions = [f"/runs/{run.id}/{action}" for action in ("cancel", "fork", "delete")]
            for path in [*actions, "/agents/anything/start"]:
                request = urllib.request.Request(
                    f"http://{kernel.http}{path}",
                    data=b"confirmed=yes&input_json=null",
                    headers={
                        "authorization": f"Bearer {SECRET}",
                        "origin": f"http://{kernel.http}",
                        "content-type": "application/x-www-form-urlencoded",
                    },
                    method="POST",
                )
                with pytest.raises(urllib.error.HTTPError) as refused:
                    await asyncio.to_thread(urllib.request.urlopen, request)
                assert refused.value.code == 403, path
            assert (await client.get_run(run.id)).run.status == "pending"

            def admin_sees_them() -> None:
                browser.driver.find_element(By.CSS_SELECTOR, "form.logout button").click()
                browser.until("the key form", lambda d: d.find_elements(By.NAME, "key"))
                browser.open(f"/runs/{run.id}")
                browser.until("the key form", lambda d: d.find_elements(By.NAME, "key"))
                browser.driver.find_element(By.NAME, "key").send_keys("admin-key\n")
                browser.until(
                    "the actions", lambda d: d.find_elements(By.CSS_SELECTOR, "form.cancel-run")
                )

            await asyncio.to_thread(admin_sees_them)
    finally:
        kernel.stop()


async def test_runs_are_found_by_id_by_a_tool_they_called_and_by_when_they_were_created(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, add_up):
            adding = await client.create_run("finder")
            await client.call_turn(adding.id, 0, [ToolCall("add_up", {"a": 1, "b": 1})])
            idle = await client.create_run("finder")
            browser = await asyncio.to_thread(chrome, kernel)

            def row(run_id: str) -> Callable[[WebDriver], Any]:
                return lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-run="{run_id}"]')

            def check() -> None:
                browser.open("/runs?tool=add_up")
                browser.until("the run that called add_up", row(adding.id))
                assert idle.id not in browser.source()
                browser.open("/runs?since=15m")
                browser.until("the recent runs", row(idle.id))
                assert row(adding.id)(browser.driver)
                for window in ("from=2999-01-01T00:00", "to=2000-01-01T00:00"):
                    browser.open(f"/runs?{window}")
                    browser.until(f"nothing {window}", lambda d: "No runs match." in browser.text())
                browser.open("/runs?from=yesterday")
                browser.until("the refusal", lambda d: "from: 'yesterday'" in browser.text())
                browser.open("/runs")
                browser.until("the id box", lambda d: d.find_elements(By.NAME, "q"))
                browser.driver.find_element(By.NAME, "q").send_keys(idle.id + "\n")
                browser.until(
                    "the run's page", lambda d: d.current_url.endswith(f"/runs/{idle.id}")
                )
                browser.shot("found")

            await asyncio.to_thread(check)
    finally:
        kernel.stop()


async def test_the_approvals_page_follows_what_arrives_and_is_answered_and_confirms_who_answered(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, refund):
            run = await client.create_run("support")
            browser = await asyncio.to_thread(chrome, kernel)

            def empty_page() -> None:
                browser.open("/approvals")
                browser.until("an empty list", lambda d: "Nothing waits" in browser.text())

            await asyncio.to_thread(empty_page)
            first = asyncio.create_task(
                client.call_turn(run.id, 0, [ToolCall("refund", {"cents": 700})])
            )

            def answer_it() -> None:
                # It arrives on the page left open, with no reload.
                card = browser.until(
                    "the approval arriving",
                    lambda d: d.find_element(By.CSS_SELECTOR, "article.approval"),
                )
                card.find_element(By.NAME, "decider").send_keys("alice")
                card.find_element(By.NAME, "reason").send_keys("receipt checked")
                card.find_element(By.CSS_SELECTOR, "button.approve").click()
                banner = browser.until(
                    "the confirmation", lambda d: d.find_element(By.CSS_SELECTOR, "p.answered")
                )
                assert "was approved by alice (receipt checked)" in banner.text, banner.text
                assert "refund" in banner.text
                browser.shot("answered")

            await asyncio.to_thread(answer_it)
            [done] = (await first).results
            assert done.outcome == CallOutcome.OK
            second = asyncio.create_task(
                client.call_turn(run.id, 1, [ToolCall("refund", {"cents": 800})])
            )
            await asyncio.to_thread(
                browser.until,
                "the second approval arriving",
                lambda d: '"cents": 800' in browser.text(),
            )
            [waiting] = await client.list_approvals(run_id=run.id)
            await client.reject(waiting.id, decider="bob", reason="too late")
            # Answered elsewhere, it leaves the page left open.
            await asyncio.to_thread(
                browser.until,
                "the answered approval leaving",
                lambda d: '"cents": 800' not in browser.text(),
            )
            [rejected] = (await second).results
            assert rejected.outcome == CallOutcome.REJECTED

            def the_wait_shows_on_the_timeline() -> None:
                # The rejected call never ran, and its wait for a person is still drawn.
                browser.open(f"/runs/{run.id}")
                bar = browser.until(
                    "the wait for a person",
                    lambda d: d.find_element(
                        By.CSS_SELECTOR, 'details.step[data-key="t1/p0"] .bar.person'
                    ),
                )
                assert "rejected by bob" in (bar.get_attribute("title") or "")
                assert "waiting for a person" in browser.text(), "the legend names it"
                assert browser.driver.find_elements(By.CSS_SELECTOR, ".ticks .tick")
                browser.shot("timeline")

            await asyncio.to_thread(the_wait_shows_on_the_timeline)
    finally:
        kernel.stop()


class Greeting(pydantic.BaseModel):
    """Whom to greet, and how often."""

    name: str
    times: int = 1


@agent
async def greeter(ctx: AgentContext, greeting: Greeting) -> dict[str, str]:
    """Greets someone a few times."""
    return {"said": ", ".join([f"hello {greeting.name}"] * greeting.times)}


async def test_a_hosted_agents_run_is_started_from_a_form_made_from_its_input_schema(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, agents=[greeter]):
            browser = await asyncio.to_thread(chrome, kernel)

            def start_one() -> str:
                browser.open("/registry")
                row = browser.until(
                    "the hosted agent",
                    lambda d: d.find_element(By.CSS_SELECTOR, 'tr[data-agent="greeter"]'),
                )
                row.find_element(By.CSS_SELECTOR, "a.start").click()
                browser.until("the input form", lambda d: d.find_elements(By.NAME, "field:name"))
                browser.driver.find_element(By.NAME, "field:name").send_keys("ada")
                browser.driver.find_element(By.NAME, "field:times").send_keys("2")
                browser.driver.find_element(By.NAME, "labels").send_keys("team=docs")
                browser.shot("start-form")
                browser.driver.find_element(
                    By.CSS_SELECTOR, "form.start button[type=submit]"
                ).click()
                browser.until("the confirmation", lambda d: '"name": "ada"' in browser.text())
                browser.driver.find_element(By.CSS_SELECTOR, "form.confirm button.danger").click()
                browser.until("the run's page", lambda d: "/runs/" in d.current_url)
                return str(browser.driver.current_url.rsplit("/", 1)[-1])

            run_id = await asyncio.to_thread(start_one)
            done = await ended_run(client, run_id)
            assert done.status == "completed", done
            assert done.output == {"said": "hello ada, hello ada"}
            assert done.labels == {"team": "docs"}
    finally:
        kernel.stop()


def showing(browser: Browser, text: str) -> Callable[[WebDriver], bool]:
    """A wait's check: the page's source holds `text`."""
    return lambda _: text in browser.source()


async def test_without_javascript_every_page_reads_whole_with_times_in_utc(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, add_up):
            run = await client.create_run("plain")
            await client.call_turn(run.id, 0, [ToolCall("add_up", {"a": 2, "b": 3})])
            browser = await asyncio.to_thread(chrome, kernel)

            def read() -> None:
                browser.driver.execute_cdp_cmd(
                    "Emulation.setScriptExecutionDisabled", {"value": True}
                )
                browser.open(f"/runs/{run.id}")
                step = browser.until(
                    "the step",
                    lambda d: d.find_element(By.CSS_SELECTOR, 'details.step[data-key="t0/p0"]'),
                )
                step.find_element(By.CSS_SELECTOR, "summary").click()
                browser.until("its arguments", lambda d: '"a": 2' in step.text)
                created = browser.driver.find_element(By.CSS_SELECTOR, "dl.header time")
                assert created.text.endswith("Z") and "T" in created.text, created.text
                assert created.text == created.get_attribute("datetime")
                # A Copy button needs the script: without it, none is shown.
                assert not [
                    b
                    for b in browser.driver.find_elements(By.CSS_SELECTOR, "button.copy")
                    if b.is_displayed()
                ]
                assert "run:created" in browser.text()
                browser.shot("no-javascript")
                # Every other page reads whole too.
                row = f'data-run="{run.id}"'
                for path, shows in (
                    ("/runs", row),
                    ("/runs?agent=plain", row),
                    ("/approvals", "Nothing waits for an answer."),
                    ("/registry", "add_up"),
                    ("/limits", "No tool limit"),
                ):
                    browser.open(path)
                    browser.until(f"{path} read", showing(browser, shows))

            await asyncio.to_thread(read)
    finally:
        kernel.stop()


def tab_to(browser: Browser, what: str, found: Callable[[Any], bool], limit: int = 40) -> Any:
    """Presses Tab until the focused element is `found`; fails naming what the keys reached."""
    reached: list[str] = []
    for _ in range(limit):
        browser.driver.switch_to.active_element.send_keys(Keys.TAB)
        focused = browser.driver.switch_to.active_element
        if found(focused):
            return focused
        reached.append(f"{focused.tag_name}:{focused.text[:30]!r}")
    raise AssertionError(f"Tab never reached {what}; it reached {reached}")


async def test_a_long_runs_steps_are_paged_and_every_part_is_reached_by_keyboard(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, add_up):
            run = await client.create_run("long")
            for turn in range(3):
                calls = [ToolCall("add_up", {"a": turn, "b": n}) for n in range(100)]
                await client.call_turn(run.id, turn, calls)
            browser = await asyncio.to_thread(chrome, kernel)

            def steps() -> list[str]:
                return [
                    str(step.get_attribute("data-key"))
                    for step in browser.driver.find_elements(By.CSS_SELECTOR, "details.step")
                ]

            def read() -> None:
                browser.open(f"/runs/{run.id}")
                browser.until("the pager", lambda d: "Steps 1\u2013200 of 300" in browser.text())
                assert "page 1 of 2" in browser.text()
                first = steps()
                assert len(first) == 200 and first[0] == "t0/p0", first[:3]
                # The keyboard: the first Tab shows the skip link, which leads past the navigation.
                skip = tab_to(browser, "the skip link", lambda e: e.text == "Skip to content")
                skip.send_keys(Keys.ENTER)
                assert browser.driver.switch_to.active_element.get_attribute("id") == "main"
                following = tab_to(browser, "the next page", lambda e: e.text == "Next \u203a")
                following.send_keys(Keys.ENTER)
                browser.until("page 2", lambda d: d.current_url.endswith("?page=2"))
                browser.until(
                    "the second page", lambda d: "Steps 201\u2013300 of 300" in browser.text()
                )
                second = steps()
                assert len(second) == 100 and second[0] == "t2/p0", second[:3]
                # A deep page draws its steps' attempts too (from the events where they begin).
                bars = browser.driver.find_elements(By.CSS_SELECTOR, "details.step .bar.attempt")
                assert len(bars) == 100, len(bars)
                summary = tab_to(browser, "a step", lambda e: e.tag_name == "summary", limit=60)
                summary.send_keys(Keys.ENTER)
                step = browser.driver.find_element(
                    By.CSS_SELECTOR, 'details.step[data-key="t2/p0"]'
                )
                browser.until("the step opened", lambda d: step.get_attribute("open") is not None)
                assert '"a": 2' in step.text
                browser.shot("paged")
                # The time axis zooms in and back out with plain links.
                browser.driver.find_element(By.CSS_SELECTOR, "nav.zoom a.zoom-in").click()
                browser.until("zoomed", lambda d: "&zoom=" in d.current_url)
                assert "page=2" in browser.driver.current_url
                # Its ticks start a quarter of the way along the page's axis, not at 0.
                first_tick = browser.driver.find_element(By.CSS_SELECTOR, ".ticks .tick")
                assert str(first_tick.get_attribute("textContent")).startswith("+"), first_tick
                browser.driver.find_element(By.CSS_SELECTOR, "nav.zoom a.whole").click()
                browser.until("the whole axis", lambda d: "zoom=" not in d.current_url)
                browser.open(f"/runs/{run.id}?zoom=9-3")
                browser.until(
                    "the zoom refused", lambda d: "zoom: expected FROM-TO" in browser.text()
                )
                browser.open(f"/runs/{run.id}?page=0")
                browser.until(
                    "the refusal", lambda d: "page: expected a page number from 1" in browser.text()
                )
                browser.open(f"/runs/{run.id}?page=9")
                browser.until("the last page", lambda d: "page 2 of 2" in browser.text())

            await asyncio.to_thread(read)
    finally:
        kernel.stop()


@tool
async def sometimes_fails(ctx: ToolContext, n: int) -> int:
    """Fails on odd numbers."""
    if n % 2:
        raise ValueError(f"{n} is odd")
    return n


async def test_tools_show_their_rates_and_latency_and_a_worker_that_left_is_marked_gone(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client:
            browser = await asyncio.to_thread(chrome, kernel)
            async with serving(kernel, sometimes_fails, name="flaky", max_concurrency=3):
                run = await client.create_run("rates")
                calls = [ToolCall("sometimes_fails", {"n": n}) for n in range(10)]
                results = (await client.call_turn(run.id, 0, calls)).results
                assert [r.outcome for r in results].count(CallOutcome.TOOL_ERROR) == 5

                def figures() -> None:
                    browser.open("/registry")
                    row = browser.until(
                        "the tool's row",
                        lambda d: d.find_element(
                            By.CSS_SELECTOR, 'tr[data-tool="sometimes_fails"]'
                        ),
                    )

                    def cell(name: str) -> str:
                        return str(row.find_element(By.CSS_SELECTOR, f"td.{name}").text)

                    assert cell("calls") == "10", row.text
                    assert cell("failed") == "5 (50.0%)", row.text
                    assert cell("p50").startswith("≤ ") and cell("p99").startswith("≤ "), row.text
                    assert float(cell("per-minute")) > 0, row.text
                    # The worker's slots over time: its chart says what it shows.
                    chart = browser.driver.find_element(
                        By.CSS_SELECTOR, 'tr[data-worker="flaky"] svg.slots'
                    )
                    assert "of 3" in str(chart.get_attribute("aria-label")), chart.get_attribute(
                        "aria-label"
                    )

                    # Sampled every ten seconds: wait for a sample that saw the worker.
                    def sampled(d: WebDriver) -> bool:
                        d.refresh()
                        bars = d.find_elements(
                            By.CSS_SELECTOR, 'tr[data-worker="flaky"] svg.slots rect:not(.full)'
                        )
                        return len(bars) >= 2

                    WebDriverWait(browser.driver, 30, poll_frequency=1).until(sampled)
                    browser.shot("rates")

                await asyncio.to_thread(figures)

            def gone() -> None:
                browser.open("/registry")
                row = browser.until(
                    "the worker marked gone",
                    lambda d: d.find_element(By.CSS_SELECTOR, 'tr.gone[data-worker="flaky"]'),
                )
                assert "gone" in row.text and "last seen" in row.text, row.text
                browser.shot("gone")

            await asyncio.to_thread(gone)
    finally:
        kernel.stop()


@agent
async def grandparent(ctx: AgentContext, input: None) -> object:
    """Starts a parent, which starts counters: a tree of subagent runs two levels deep."""
    return await ctx.subagent("py_parent", None)


async def test_subagents_are_a_tree_and_a_branch_is_compared_with_its_parent(
    tmp_path: Path, chrome: Callable[[Kernel], Browser]
) -> None:
    kernel = console_kernel(tmp_path)
    try:
        agents = [grandparent, hosted_agents.py_parent, hosted_agents.py_counter]
        async with AgentClient(kernel.addr) as client, serving(kernel, add_up, agents=agents):
            hosted = await client.create_run("grandparent", hosted=True)
            assert (await ended_run(client, hosted.id)).status == "completed"
            parent = await client.create_run("compared")
            await client.call_turn(parent.id, 0, [ToolCall("add_up", {"a": 1, "b": 1})])
            await client.call_turn(parent.id, 1, [ToolCall("add_up", {"a": 2, "b": 2})])
            branch = await client.fork_run(parent.id, set_results={"t0/p0": 42})
            [replayed] = (
                await client.call_turn(branch.id, 0, [ToolCall("add_up", {"a": 1, "b": 1})])
            ).results
            assert replayed.output == 42
            [blocked] = (
                await client.call_turn(branch.id, 1, [ToolCall("add_up", {"a": 5, "b": 5})])
            ).results
            assert blocked.outcome == CallOutcome.WRITE_TOOL_BLOCKED, blocked
            browser = await asyncio.to_thread(chrome, kernel)

            def read() -> None:
                browser.open(f"/runs/{hosted.id}")
                tree = browser.until(
                    "the subagents",
                    lambda d: d.find_elements(By.CSS_SELECTOR, "section.children li[data-run]"),
                )
                # py_parent under the run, its three counters under it, each a link.
                assert len(tree) == 4, [li.text for li in tree]
                assert "py_parent" in tree[0].text and "↳" not in tree[0].text
                assert all("py_counter" in li.text and "↳" in li.text for li in tree[1:])
                tree[1].find_element(By.CSS_SELECTOR, "a").click()
                browser.until("a counter's page", lambda d: "py_counter" in browser.text())
                browser.open(f"/runs/{parent.id}")
                link = browser.until(
                    "the branch",
                    lambda d: d.find_element(By.CSS_SELECTOR, "section.branches a.compare"),
                )
                assert branch.id in browser.source()
                link.click()
                browser.until("the comparison", lambda d: "Compare runs" in browser.text())
                assert "B is a branch of A" in browser.text()
                assert "The branch stopped at t1/p0" in browser.text()
                first = browser.driver.find_element(By.CSS_SELECTOR, 'tr[data-key="t0/p0"]')
                assert "set" in first.find_element(By.CSS_SELECTOR, "td.mark").text
                assert "result" in first.find_element(By.CSS_SELECTOR, "td.differs").text
                first.find_element(By.CSS_SELECTOR, "details.both summary").click()
                assert "42" in first.text and "2" in first.text
                second = browser.driver.find_element(By.CSS_SELECTOR, 'tr[data-key="t1/p0"]')
                assert "blocked" in second.find_element(By.CSS_SELECTOR, "td.mark").text
                browser.shot("compare")
                browser.open(f"/runs?branch_of={parent.id}")
                browser.until("the branch listed", showing(browser, f'data-run="{branch.id}"'))
                assert f'data-run="{parent.id}"' not in browser.source()
                browser.open(f"/compare?a={parent.id}")
                browser.until("the refusal", lambda d: "b: missing" in browser.text())

            await asyncio.to_thread(read)
    finally:
        kernel.stop()
