#!/usr/bin/env bash
# Regenerate docs/dashboard.png and docs/task.png: the headless-Chromium
# dashboard test seeds a job run, a failed and a cancelled task and a lock
# on SQLite, drives the page, and with BATON_UPDATE_SCREENSHOT=1 writes
# its screenshots into docs/. Needs /usr/bin/chromium (apt install chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
BATON_UPDATE_SCREENSHOT=1 cargo test -p baton-cli --test cli -- --exact \
  cli_admin::dashboard_in_chromium_shows_seeded_rows_and_retries
ls -l docs/dashboard.png docs/task.png
