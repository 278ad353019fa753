#!/usr/bin/env bash
# Headless Chromium for the browser test (tests/browser/test_first_ten_minutes.py drives it with Playwright's
# `executable_path`; Playwright's own browser download needs a CDN these machines cannot reach).
# Debian's `chromium` package where we may install it; otherwise the test skips and says why.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_browser: no apt-get here; install Chromium yourself to run the browser test" >&2
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium; } \
    || echo "install_browser: could not install chromium; the browser test will be skipped" >&2
elif sudo -n true 2>/dev/null; then
  sudo apt-get install -y -qq chromium >/dev/null 2>&1 || { sudo apt-get update -qq && sudo apt-get install -y -qq chromium; } \
    || echo "install_browser: could not install chromium; the browser test will be skipped" >&2
else
  echo "install_browser: not root and no sudo; install chromium to run the browser test" >&2
fi
