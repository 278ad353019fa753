"""What the browser tests share: a headless Chromium on the app a module serves."""
import pytest

from tests.browser.helpers import open_page


@pytest.fixture
def viewport() -> dict[str, int]:
    """The browser window's size; a module that draws for another screen overrides this fixture."""
    return {"width": 1440, "height": 1000}


@pytest.fixture
def browser_page(app, viewport):
    """Headless Chromium at ``viewport`` beside ``app`` (each module's served app fixture): yields (page, app)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser, page = open_page(p, **viewport)
        yield page, app
        browser.close()
