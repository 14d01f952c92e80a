"""The Content-Security-Policy refuses nothing the pages need: the charts (plotly.js from this origin), the
dashboard script and the API docs (Swagger UI with its start-up script from a URL) work, with no refusal logged."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_the_deployment_page_and_the_api_docs_run_under_the_policy(page, live_server, login, operator, fleet):
    login(page, operator)
    page.goto(f"{live_server.url}/deployments/demo/")
    page.wait_for_function("() => Number((document.getElementById('chart-ttft') || {dataset: {}}).dataset.points) > 0")
    page.goto(f"{live_server.url}/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title")
    assert page.csp_violations == [] and page.js_errors == []


def test_an_inline_script_is_refused(page, live_server, login, operator, fleet):
    login(page, operator)
    page.goto(f"{live_server.url}/deployments/demo/")
    page.evaluate("""() => { const s = document.createElement('script'); s.textContent = 'window.__ran = true';
                             document.body.appendChild(s); }""")
    assert page.evaluate("() => window.__ran === true") is False
    for _ in range(100):  # the refusal reaches the console asynchronously: wait for it (up to 10 s)
        if any("inline script" in violation for violation in page.csp_violations):
            break
        page.wait_for_timeout(100)
    assert any("inline script" in violation for violation in page.csp_violations)
