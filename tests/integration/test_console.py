"""The console in a real browser: Debian's Chromium driven by Playwright (`make test` installs both;
Playwright's own browser download does not work here). Screenshots of each page go to the test's
directory (pytest's tmp_path), to look at."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import TEST_TOKEN, Stack, wait_until

pytestmark = pytest.mark.spark

CHROMIUM = "/usr/bin/chromium"
HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'


@pytest.fixture
def browser_page(tmp_path: Path):  # noqa: ANN201
    if shutil.which(CHROMIUM) is None:
        pytest.skip("Chromium is not installed: `make test` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.errors = errors
            yield page
        finally:
            browser.close()


def test_the_console_signs_in_shows_exact_snapshot_ids_survives_a_reload_and_shows_events_as_text(
    stack: Stack, browser_page, tmp_path: Path,  # noqa: ANN001
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    with stack.client() as http:
        assert http.post("/v1/pipelines", json={
            "name": "strict", "source": {"http": {"path": "/strict"}},
            "sinks": [{"table": "strict", "auto_create": True, "schema": {"columns": [{"name": "id", "type": "string", "required": True}]}}],
        }).status_code == 201
        assert http.post("/logs?wait=true&timeout=90", json=[{"id": "a", "msg": HOSTILE}, {"id": "b", "msg": "plain"}]).status_code == 200
        assert http.post("/logs?wait=true&timeout=90", json={"id": "c", "msg": "later"}).status_code == 200  # a second snapshot
        assert http.post("/strict?wait=true&timeout=90", json=[{"id": "ok"}, {"note": HOSTILE}]).json()["dlq_events"] == 1
        described = http.get("/v1/tables/logs").json()
        snapshot_id, snapshots = described["current_snapshot_id"], len(described["snapshots"])
        page_answer = http.get("/", headers={"Accept": "text/html"})
    assert snapshot_id > 2**53, "Iceberg snapshot ids are 63-bit: the point of this check"
    assert "script-src 'self'" in page_answer.headers["content-security-policy"]
    assert "<script>" not in page_answer.text.replace('<script src="/console/console.js" defer></script>', ""), "no inline script"

    page.goto(stack.url + "/")
    page.fill("#token", "calve_not-a-token")
    page.click("button[type=submit]")
    page.wait_for_selector("#view .err")
    assert "401" in page.inner_text("#view .err") and "Sign in with a valid token" in page.inner_text("#view .err")

    page.fill("#token", TEST_TOKEN)
    page.click("button[type=submit]")
    page.wait_for_selector("#view .list a")
    assert set(page.locator("#view .list a").all_inner_texts()) >= {"logs", "strict", "_calve_dlq"}
    logs_row = page.locator("#view tbody tr").filter(has=page.locator("a:text-is('logs')")).locator("td").all_inner_texts()
    assert (logs_row[1], logs_row[3]) == ("3", "2") and logs_row[2].endswith("B") and logs_row[4].endswith("ago)"), "rows, size, files, last commit"
    page.screenshot(path=str(tmp_path / "tables.png"), full_page=True)

    page.click("#view .list a:text-is('logs')")
    page.wait_for_selector("#rows table")
    assert page.url.endswith("#table/logs")
    assert page.locator("#view h2").first.inner_text() == "Table logs", "the table's page replaces the list, at the top"
    text = page.inner_text("#view")
    assert str(snapshot_id) in text, f"snapshot id {snapshot_id} shown exactly"
    assert "map<string, string>" in page.inner_text("#view"), "the _extra column's type, spelled as in a definition"
    marks = page.locator("#snapshot-timeline rect")
    expect(marks).to_have_count(snapshots)
    xs = [float(x) for x in marks.evaluate_all("marks => marks.map((m) => m.getAttribute('x'))")]
    newest = xs.index(max(xs))
    assert str(snapshot_id) in marks.nth(newest).locator("title").text_content(), "the current snapshot is the rightmost mark"
    assert HOSTILE in text, "an event's HTML is shown as text"
    # Health a person reads at a glance: sentences, sizes in KiB, times with how long ago; no raw counters.
    health = page.inner_text("#table-health")
    assert "2 data files, all small: compaction will merge them." in health and "KiB" in health, health
    assert "avg_file_bytes" not in text and "oldest_snapshot_ms" not in text and " ago" in text
    # The navigation marks where the page is: a table's page is under Tables.
    expect(page.locator("#nav a[aria-current='page']")).to_have_text("Tables")
    page.screenshot(path=str(tmp_path / "table.png"), full_page=True)
    page.fill("#row-filter input", "id = 'b'")
    page.click("#row-filter button")

    expect(page.locator("#rows tbody tr")).to_have_count(1)
    assert "plain" in page.inner_text("#rows") and HOSTILE not in page.inner_text("#rows"), "only the row that matches"
    page.fill("#row-filter input", "level = ")
    page.click("#row-filter button")
    page.wait_for_selector("#rows .err")
    assert "query.filter" in page.inner_text("#rows .err") and "character" in page.inner_text("#rows .err")
    # A column the table lacks is NULL in every row: no rows, and the page says why.
    page.fill("#row-filter input", "colour = 'red'")
    page.click("#row-filter button")
    expect(page.locator("#rows")).to_contain_text("has no column 'colour'")
    assert page.locator("#rows tbody tr").count() == 0

    page.reload()
    page.wait_for_selector("#view table")
    assert page.locator("#view h2").first.inner_text() == "Table logs", "a reload keeps the tab's token and page"

    page.click("#nav a[href='#dlq']")
    expect(page.locator("#view")).to_contain_text("no field of the event matches a column")  # not the table page's tables
    dlq_text = page.inner_text("#view")
    assert "<script>window.pwned=2</script>" in dlq_text and "no field of the event matches a column" in dlq_text, "the DLQ's event JSON, as text"
    page.screenshot(path=str(tmp_path / "dlq.png"), full_page=True)
    page.click("#nav a[href='#pipelines']")
    expect(page.locator("#view h2").first).to_have_text("Pipelines")  # the DLQ's table may still be there a moment
    expect(page.locator("#view tbody")).to_contain_text("strict")
    page.screenshot(path=str(tmp_path / "pipelines.png"), full_page=True)

    # The overview draws rates from /v1/stats, sampled every 2 s while events keep coming.
    page.click("#nav a[href='#overview']")
    page.wait_for_selector("#overview-charts figure")
    committed = page.locator("figure[data-title='Events committed /s']")
    with stack.client() as http:
        for i in range(30):
            assert http.post("/logs?wait=true&timeout=90", json=[{"id": f"o{i}-{n}"} for n in range(20)]).status_code == 200
            if float(committed.get_attribute("data-max")) > 0:
                break
    assert float(committed.get_attribute("data-max")) > 0, "the committed rate was drawn"
    assert float(page.locator("figure[data-title='Events received /s']").get_attribute("data-max")) > 0
    # Latency quantiles from the histogram's buckets between two samples (each wait=true took > 0 s).
    for title in ("wait=true latency p50 (s)", "wait=true latency p99 (s)"):
        expect(page.locator(f"figure[data-title='{title}']")).not_to_have_attribute("data-max", "0", timeout=15_000)
    assert "logs" in page.inner_text("#overview-body")
    # Each chart has its axes: a round top of scale at or above its largest value, and its time span.
    chart = page.locator("figure[data-title='Events committed /s']")
    top = float(chart.locator(".chart-y span").first.inner_text().replace(",", ""))
    assert top >= float(chart.get_attribute("data-max")) > 0 and "min ago" in chart.locator(".chart-x").inner_text()
    expect(page.locator("#nav a[aria-current='page']")).to_have_text("Overview")
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)

    # On a phone's width no page is wider than the screen: a wide table scrolls inside its box.
    page.set_viewport_size({"width": 390, "height": 844})
    for hash_ in ("#tables", "#table/logs", "#pipelines", "#pipeline/strict", "#dlq", "#overview", "#tokens", "#try"):
        page.goto(stack.url + "/" + hash_)
        page.wait_for_load_state("networkidle")
        expect(page.locator("#view")).not_to_contain_text("loading…")
        width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"{hash_} is {width[0]} px wide on a {width[1]} px screen"
        page.screenshot(path=str(tmp_path / f"narrow-{hash_[1:].replace('/', '-')}.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})

    assert page.evaluate("window.pwned") is None, "nothing from an event ran"
    assert page.evaluate("sessionStorage.getItem('calve-token')") == TEST_TOKEN
    assert TEST_TOKEN not in page.url
    page.click("#signout")
    assert page.evaluate("sessionStorage.getItem('calve-token')") is None
    # The browser logs the answers to the bad token (401) and the bad filter (422) as errors; nothing else.
    assert not [e for e in page.errors if "401" not in e and "422" not in e], page.errors


BAD_DEFINITION = """name: orders
source: {http: {path: /orders}}
sinks:
  - table: orders
    auto_create: true
    schema:
      columns:
        - {name: id, type: string, required: true}
        - {name: amount, type: strng}
"""


def test_a_user_creates_a_pipeline_sends_events_replays_the_dlq_and_manages_tokens_in_the_browser(
    stack: Stack, browser_page, tmp_path: Path,  # noqa: ANN001
) -> None:
    import httpx
    from playwright.sync_api import expect

    page = browser_page
    page.on("dialog", lambda dialog: dialog.accept())  # the confirmations of revoke and delete
    page.goto(stack.url + "/#pipelines")
    page.fill("#token", TEST_TOKEN)
    page.click("button[type=submit]")

    # A definition with a wrong type: the 422 names the field; fixed, it is saved.
    page.wait_for_selector("#definition")
    page.fill("#definition", BAD_DEFINITION)
    page.click("#save-definition")
    page.wait_for_selector("#definition-errors li")
    assert "sinks[0].schema.columns[1].type" in page.inner_text("#definition-errors")
    page.screenshot(path=str(tmp_path / "pipeline-error.png"), full_page=True)
    page.fill("#definition", BAD_DEFINITION.replace("strng", "double"))
    page.click("#save-definition")
    page.wait_for_selector("#definition-outcome:has-text('saved')")  # no wait_for_function: the CSP forbids its eval
    assert "saved orders version 1" in page.inner_text("#definition-outcome")
    # A second version (through the API), compared with the first on the pipeline's page.
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {TEST_TOKEN}"}) as http:
        second = http.get("/v1/pipelines/orders").json()["definition"]
        second["sinks"][0]["snapshot_max_count"] = 500
        assert http.put("/v1/pipelines/orders", json=second).json()["version"] == 2
    page.goto(stack.url + "/#pipeline/orders")
    page.click("#compare-versions")
    expect(page.locator("#pipeline-diff span.add")).to_have_count(1)
    assert page.inner_text("#pipeline-diff span.add").strip() == "+  snapshot_max_count: 500"
    assert "--- orders version 1" in page.inner_text("#pipeline-diff")
    page.screenshot(path=str(tmp_path / "pipeline-diff.png"), full_page=True)

    # Try it: one good event, one without its required id (to the DLQ).
    page.click("#nav a[href='#try']")
    page.wait_for_selector("#try-path option[value='/orders']", state="attached")
    page.select_option("#try-path", "/orders")
    page.fill("#try-events", '{"id": "o-1", "amount": 2.5}\n{"amount": 3}')
    page.click("#try-send")
    page.wait_for_selector("#try-answer:has-text('committed')", timeout=90_000)
    answer = page.inner_text("#try-answer")
    assert '"dlq_events": 1' in answer and '"rows": 1' in answer
    page.screenshot(path=str(tmp_path / "try.png"), full_page=True)

    page.click("#nav a[href='#tables']")
    page.click("#view .list a:text-is('orders')")
    # The table page shows its snapshots at once; its rows arrive after a second request.
    expect(page.locator("#rows")).to_contain_text("o-1")

    # Replay the dead letter: it fails again (still no id), and the replay's receipt completes.
    page.click("#nav a[href='#dlq']")
    page.wait_for_selector("#view input[type=checkbox]")
    # Its detail first: every field, and the event pretty-printed.
    page.click("#view tbody button:text-is('View')")
    page.wait_for_selector("#dlq-entry pre")
    assert '"amount": 3' in page.inner_text("#dlq-entry pre")
    assert "missing required field" in page.inner_text("#dlq-entry dl") and "orders" in page.inner_text("#dlq-entry dl")
    page.check("#view input[type=checkbox]")
    page.click("#replay")
    page.wait_for_selector("#replay-outcome:has-text('committed')", timeout=90_000)
    assert "replayed 1" in page.inner_text("#replay-outcome")
    page.screenshot(path=str(tmp_path / "replay.png"), full_page=True)

    # The entry failed again (still no id): filter the DLQ by reason and purge what matches.
    page.click("#nav a[href='#tables']")
    page.click("#nav a[href='#dlq']")
    page.wait_for_selector("#dlq-filter")
    page.fill("#dlq-filter input[name=reason]", "missing required field")
    page.click("#dlq-filter button[type=submit]")
    page.wait_for_selector("#view td:has-text('missing required field')")
    assert page.locator("#view tbody tr").count() == 1
    page.click("#purge")
    page.wait_for_selector("#view p:text-is('none')")
    with stack.client() as http:
        assert http.get("/v1/dlq").json()["entries"] == []

    # A token created is shown once; revoked, it no longer works.
    page.click("#nav a[href='#tokens']")
    page.wait_for_selector("#token-label")
    page.fill("#token-label", "shipper")
    page.click("#create-token")
    page.wait_for_selector("#token-value")
    new_token = page.inner_text("#token-value")
    assert new_token.startswith("calve_")
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {new_token}"}) as http:
        assert http.post("/orders", json={"id": "o-2"}).status_code == 202
    page.screenshot(path=str(tmp_path / "token.png"), full_page=True)
    page.reload()
    row = page.locator("#view tr", has_text="shipper")
    row.locator("button", has_text="Revoke").click()
    page.locator("#view tr", has_text="shipper").locator("button").wait_for(state="detached")
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {new_token}"}) as http:
        assert http.post("/orders", json={"id": "o-3"}).status_code == 401
    assert new_token not in page.content(), "a token is shown only once"
    assert not [e for e in page.errors if "401" not in e and "422" not in e], page.errors


def test_an_operator_creates_disables_and_enables_a_tenant_in_the_browser(stack: Stack, browser_page, tmp_path: Path) -> None:  # noqa: ANN001
    import httpx
    from sqlmodel import Session

    from service.core.db import get_engine
    from service.tenancy.tenants import issue_token

    with Session(get_engine(stack.settings.resolved_database_url())) as session:
        _row, operator = issue_token(session, None, label="console")
    page = browser_page
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(stack.url + "/#tenants")
    page.fill("#token", operator)
    page.click("button[type=submit]")
    page.wait_for_selector("#new-tenant")
    page.fill("#new-tenant input[name=name]", "acme")
    page.fill("#new-tenant input[name=max_events_per_s]", "1000")
    page.click("#new-tenant button[type=submit]")
    page.wait_for_selector("#tenant-token-value")
    acme = page.inner_text("#tenant-token-value")
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {acme}"}) as http:
        assert http.get("/v1/tables").status_code == 200
    page.reload()
    row = page.locator("#view tr", has_text="acme")
    assert "1000" in row.inner_text()
    row.locator("button", has_text="Disable").click()
    page.locator("#view tr", has_text="acme").locator("button", has_text="Enable").wait_for()
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {acme}"}) as http:
        assert http.get("/v1/tables").status_code in (401, 403), "a disabled tenant's token is refused"
    page.screenshot(path=str(tmp_path / "tenants.png"), full_page=True)
    # Limits: one changed, one back to the default; the list shows them and the backlog.
    page.locator("#view tr", has_text="acme").locator("button", has_text="Limits").click()
    page.fill("#tenant-limits input[name=max_backlog_events]", "777")
    page.fill("#tenant-limits input[name=max_events_per_s]", "")
    page.click("#tenant-limits button[type=submit]")
    page.wait_for_selector("#new-tenant")
    assert "backlog_events" in page.inner_text("#view thead") and "committed_events" in page.inner_text("#view thead")
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {operator}"}) as http:
        (listed,) = [t for t in http.get("/v1/tenants").json()["tenants"] if t["name"] == "acme"]
    assert listed["max_backlog_events"] == 777 and listed["max_events_per_s"] is None and listed["backlog_events"] == 0
    assert "777" in page.locator("#view tr", has_text="acme").inner_text()
    # Landing prefixes: granted from the form, one refused with the api's reason, taken back.
    landing = (tmp_path / "landing" / "acme").as_uri()
    page.locator("#view tr", has_text="acme").locator("button", has_text="Landing prefixes").click()
    page.fill("#tenant-landing textarea[name=prefixes]", f"{landing}\n\n")
    page.click("#tenant-landing button[type=submit]")
    page.wait_for_selector("#tenant-landing-outcome:has-text('granted:')")
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {operator}"}) as http:
        assert http.get("/v1/tenants/acme/landing-prefixes").json()["granted"] == [landing + "/"]
    page.fill("#tenant-landing textarea[name=prefixes]", "landing/acme")
    page.click("#tenant-landing button[type=submit]")
    page.wait_for_selector("#tenant-landing-outcome.err:has-text('not a full URI')")
    page.fill("#tenant-landing textarea[name=prefixes]", "")
    page.click("#tenant-landing button[type=submit]")
    page.wait_for_selector("#tenant-landing-outcome:has-text('nothing granted')")
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {operator}"}) as http:
        assert http.get("/v1/tenants/acme/landing-prefixes").json()["granted"] == []
    page.locator("#tenant-landing button", has_text="Back").click()
    page.wait_for_selector("#new-tenant")
    page.locator("#view tr", has_text="acme").locator("button", has_text="Enable").click()
    page.locator("#view tr", has_text="acme").locator("button", has_text="Disable").wait_for()
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {acme}"}) as http:
        assert http.get("/v1/tables").status_code == 200
        # Events per second: the change of the tenant's counters since the page's previous look.
        assert http.post("/logs?wait=true&timeout=90", json=[{"n": n} for n in range(50)], timeout=120).status_code == 200
    page.click("#tenants-refresh")
    wait_until(lambda: page.evaluate("""() => {
      const table = document.querySelector('#view table');
      if (!table) return false;
      const column = [...table.tHead.rows[0].cells].findIndex((c) => c.textContent === 'committed /s');
      const row = [...table.tBodies[0].rows].find((r) => r.cells[0].textContent === 'acme');
      return column > 0 && row !== undefined && Number(row.cells[column].textContent) > 0;
    }"""), timeout_s=30, what="acme's committed events per second shown")
    assert "since the previous look" in page.inner_text("#view")
    assert acme not in page.content(), "the admin token is shown once"
