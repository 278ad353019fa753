"""What the browser tests share: a headless Chromium on the app a module serves."""
import pytest


@pytest.fixture
def viewport() -> dict[str, int]:
    """The browser window's size; a module that draws for another screen overrides this fixture."""
    return {"width": 1440, "height": 1000}


@pytest.fixture
def browser_page(app, viewport, new_page):
    """A page at ``viewport`` beside ``app`` (each module's served app fixture): (page, app)."""
    return new_page(**viewport), app
