#!/bin/sh
# Chromium for the browser test, dying with the Node process that started it
# (Playwright puts the browser in a process group of its own, so killing the
# test's group would not reach it; the parent-death signal does).
exec setpriv --pdeathsig KILL "${CHROMIUM:-/usr/bin/chromium}" "$@"
