#!/usr/bin/env bash
# Regenerate docs/screenshot.txt: `specscope top` on the fixed recording of a real demo run, in a 100x44 tmux
# pane, captured as text (the README shows it). Needs tmux and the project's .venv (./dev test makes it).
set -euo pipefail
cd "$(dirname "$0")/.."
session="specscope-shot-$$"
tmux new-session -d -s "$session" -x 100 -y 44 \
  ".venv/bin/specscope top --replay tests/fixtures/demo-recording.jsonl.gz --window 10 --interval 0.25"
trap 'tmux kill-session -t "$session" 2>/dev/null || true' EXIT
sleep 8                                   # the recording plays at 1x: let it reach the weak draft's alerts
tmux send-keys -t "$session" "+" "+" "+"  # 8x
sleep 16                                  # to ~135 s, where the weak draft (f=0.1) runs
tmux send-keys -t "$session" "p"          # pause on a moment with alerts
tmux send-keys -t "$session" Tab Down Down Down Enter  # the weak draft's engine, from the fleet table
sleep 1
tmux send-keys -t "$session" "a"          # worst acceptance first
sleep 1
tmux capture-pane -p -t "$session" | sed 's/[[:space:]]*$//' > docs/screenshot.txt
echo "wrote docs/screenshot.txt"
