"""Browser tests: the fleet page in headless chromium (tox -e browser)."""
