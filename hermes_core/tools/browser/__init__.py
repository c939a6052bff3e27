"""The browser backend: headless Chromium driven over the DevTools protocol (CDP), one browser
context per sample. `chromium.Chromium` owns the process and the protocol connection; `page.Page`
is one sample's tab: navigation, accessibility snapshots with element refs, clicks and typing."""

from hermes_core.tools.browser.chromium import BrowserError, Chromium, shared_browser
from hermes_core.tools.browser.page import Page

__all__ = ["BrowserError", "Chromium", "Page", "shared_browser"]
