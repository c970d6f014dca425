#!/usr/bin/env bash
# Screenshots of each view of an HTML report (attnreplay report / --html), as docs/images/ holds
# them for the demo's report:  scripts/report_screenshots.sh out/demo/report.html docs/images
set -euo pipefail
REPORT="$(realpath "${1:?usage: report_screenshots.sh REPORT.html [DIR]}")"
DIR="${2:-.}"
mkdir -p "$DIR"
for view in summary speed-accuracy roofline layers calls environment; do
  chromium-headless-shell --no-sandbox --disable-gpu --hide-scrollbars --host-resolver-rules="MAP * ~NOTFOUND" \
    --window-size=1280,860 --screenshot="$DIR/report-$view.png" "file://$REPORT#$view" 2>/dev/null
  echo "$DIR/report-$view.png"
done
