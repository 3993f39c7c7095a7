#!/usr/bin/env bash
# The README's pictures, from a real run on this machine, so they stay true:
#   docs/img/live.png    the terminal while `fullburn run` records an unchanged
#                        PyTorch script (examples/python/train_imagefolder.py:
#                        ResNet-18 on JPEGs through torchvision's ImageFolder and
#                        a DataLoader without workers), its live line saying
#                        what limits the job, captured from tmux
#   docs/img/report.png  the top of `fullburn report`'s HTML page of that run,
#                        in headless Chromium
# Needs the build (FULLBURN, default build/src/fullburn), Debian's python3 with
# torch and torchvision, tmux and chromium (scripts/install-deps.sh --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
fb=$(readlink -f "${FULLBURN:-build/src/fullburn}")
python=${PYTHON:-/usr/bin/python3}
[[ -x $fb ]] || { echo "readme-pictures: $fb not built: scripts/build.sh" >&2; exit 1; }
for tool in tmux chromium; do
  command -v $tool >/dev/null || { echo "readme-pictures: no $tool: apt-get install $tool" >&2; exit 1; }
done
work=$(mktemp -d)
session=fb_readme_$$
trap 'tmux kill-session -t "$session" 2>/dev/null || true; rm -rf "$work"' EXIT
export FULLBURN_STORE=$work/runs.db
mkdir -p docs/img

echo "readme-pictures: an image folder, then the run under fullburn (about 90 s)"
"$fb" make-dataset images "$work/data" --classes 4 --per-class 100 --size 200x150 >/dev/null
# A terminal 170 columns wide (the live line is one line); the job ends by itself, the pane stays.
tmux new-session -d -s "$session" -x 170 -y 8 \
  "cd $work && FULLBURN_STORE=$FULLBURN_STORE $fb run --name resnet18-imagefolder -- $python \
   $PWD/examples/python/train_imagefolder.py data --workers 0 --steps 450 --batch-size 16 --threads 1; sleep 3600"
# The live line says what limits the job ("now: CAUSE") after 20 s of steps.
for _ in $(seq 180); do
  sleep 1
  tmux capture-pane -p -t "$session" | grep -q "now: " && break
done
sleep 4
tmux capture-pane -p -e -t "$session" >"$work/live.ansi"
for _ in $(seq 300); do
  tmux capture-pane -p -t "$session" | grep -q "stored as run" && break
  sleep 1
done
grep -q "now: " "$work/live.ansi" || echo "readme-pictures: note: the live line had not yet said what limits the job" >&2

# The terminal's text and colours as an HTML page, then a screenshot of it.
"$python" - "$work/live.ansi" "$work/live.html" <<'EOF'
import html, re, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read().rstrip("\n")
lines = [l for l in text.split("\n")]
while lines and not lines[-1].strip():
    lines.pop()
colors = {30: "#4d4d4d", 31: "#f7768e", 32: "#9ece6a", 33: "#e0af68", 34: "#7aa2f7", 35: "#bb9af7",
          36: "#7dcfff", 37: "#c0caf5", 90: "#787c99", 91: "#f7768e", 92: "#9ece6a", 93: "#e0af68",
          94: "#7aa2f7", 95: "#bb9af7", 96: "#7dcfff", 97: "#ffffff"}
out, style = [], {}
def span(s):
    if not s:
        return ""
    css = ";".join("%s:%s" % kv for kv in style.items())
    return '<span style="%s">%s</span>' % (css, html.escape(s)) if css else html.escape(s)
for part in re.split(r"(\x1b\[[0-9;]*m)", "\n".join(lines)):
    m = re.fullmatch(r"\x1b\[([0-9;]*)m", part)
    if not m:
        out.append(span(part))
        continue
    for code in [int(c) if c else 0 for c in m.group(1).split(";")]:
        if code == 0:
            style = {}
        elif code == 1:
            style["font-weight"] = "bold"
        elif code == 2:
            style["opacity"] = "0.7"
        elif code in colors:
            style["color"] = colors[code]
        elif code == 39:
            style.pop("color", None)
        elif code == 22:
            style.pop("font-weight", None); style.pop("opacity", None)
page = ('<!doctype html><meta charset="utf-8"><body style="margin:0;background:#1a1b26">'
        '<pre style="margin:0;padding:14px 18px;color:#c0caf5;font:14px/1.35 \'DejaVu Sans Mono\','
        'monospace">%s</pre>' % "".join(out))
open(sys.argv[2], "w").write(page)
EOF
shoot() {  # shoot HTML PNG WIDTH HEIGHT
  chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
    --user-data-dir="$work/profile" --force-device-scale-factor=1 --window-size="$3,$4" \
    --screenshot="$work/shot.png" "file://$1" >/dev/null 2>&1
  mv "$work/shot.png" "$2"
}
shoot "$work/live.html" docs/img/live.png 1400 190
"$fb" report last -o "$work/report.html" >/dev/null
shoot "$work/report.html" docs/img/report.png 1100 1000
echo "readme-pictures: wrote docs/img/live.png and docs/img/report.png ($("$fb" runs list | sed -n 2p))"
