#!/usr/bin/env bash
# Make sure Debian's chromium and chromium-driver are installed for the browser test:
# install them with apt-get when missing (as root), otherwise say what to install.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  exit 0
fi
echo "error: the browser test needs /usr/bin/chromium and /usr/bin/chromedriver:" \
  "install the Debian packages chromium and chromium-driver" >&2
exit 1
