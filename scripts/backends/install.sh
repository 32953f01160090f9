#!/usr/bin/env bash
# Install what the test backends need: redis-server (apt, when root), Java 17 +
# Maven (apt, when root), the Ignite launcher built by Maven, and Debian's
# docker-compose (only its parser: tests/deploy/test_compose.py checks the compose
# file with it; no engine is started). Safe to rerun:
# each step is skipped when already done. Exits 0 even when a backend cannot be
# had (its tests then skip, or fail under STALWART_REQUIRE_BACKENDS=1), after
# saying why on stderr; set STALWART_REQUIRE_BACKENDS=1 to make that an error.
set -uo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
status=0
"$here/redis.sh" install || status=$?
"$here/ignite.sh" install || status=$?
(. "$here/common.sh" && need_command docker-compose docker-compose) || status=$?
if [[ $status -ne 0 && ${STALWART_REQUIRE_BACKENDS:-} == 1 ]]; then
  exit "$status"
fi
exit 0
