#!/usr/bin/env bash
# `make integration`: the integration tests on the shared local control plane and, beside them, the
# real-node install test (tests/it/helm_install.rs) as a test process of its own. That test runs on a fresh
# cluster of its own and needs the image's static release binary, which is built here at low priority while
# the other tests run, instead of holding one of their threads for the minutes it takes. The second process
# is the test binary itself: cargo holds the build directory's lock for as long as its tests run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cargo=${CARGO:-cargo}
logs=target/test-logs
rm -rf "$logs" && mkdir -p "$logs"
say() { printf '[integration] %s\n' "$*"; }

# The test environment's tools once, before two clusters start side by side.
tests/testenv/build.sh
tests/testenv/build.sh kubelet

bin=$($cargo test --locked --features conformance --test it --no-run --message-format=json |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')
[ -x "$bin" ] || { say "no test binary for tests/it"; exit 1; }

t0=$SECONDS
(
  nice -n 10 make --no-print-directory image-binary CARGO="$cargo" >"$logs/image-binary.log" 2>&1 ||
    { echo "make image-binary failed:"; tail -n 40 "$logs/image-binary.log"; exit 1; }
  echo "image binary built in $((SECONDS - t0))s"
  "$bin" helm_install::
) >"$logs/helm-install.log" 2>&1 &
install=$!

rc=0
NODES=${NODES:-10} MEMBERS=${MEMBERS:-2} tests/testenv/with-cluster.sh \
  "$cargo" test --locked --features conformance --test '*' -- --skip helm_install:: || rc=$?
say "the other tests ended after $((SECONDS - t0))s; waiting for the install test"
if wait "$install"; then
  say "install test passed ($(grep -h 'image binary built' "$logs/helm-install.log"); done after $((SECONDS - t0))s)"
else
  rc=1
  say "the install test failed:" && tail -n 200 "$logs/helm-install.log"
fi
exit "$rc"
