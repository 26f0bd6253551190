#!/usr/bin/env bash
# Builds the manual (docs/, an mdBook) into target/book with a pinned mdbook, installed once into the
# cache like the other test tools. Without default features mdbook has no `serve` or `watch` (no web
# server or file watcher to compile), so the one-time install stays short.
# Env overrides: FLEETROLL_CACHE, MDBOOK_VERSION.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MDBOOK_VERSION="${MDBOOK_VERSION:-0.5.4}"
CACHE="${FLEETROLL_CACHE:-$HOME/.cache/fleetroll}"
ROOT="$CACHE/mdbook-$MDBOOK_VERSION"
MDBOOK="$ROOT/bin/mdbook"

if [[ "$("$MDBOOK" --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]]; then
  echo "[docs.sh] installing mdbook $MDBOOK_VERSION into $ROOT (once)" >&2
  # Its own build directory, not the project's target/ (CARGO_TARGET_DIR may point there).
  env -u CARGO_TARGET_DIR cargo install mdbook --locked --quiet --version "$MDBOOK_VERSION" \
    --no-default-features --root "$ROOT"
fi
"$MDBOOK" build docs
