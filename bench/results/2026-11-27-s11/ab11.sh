#!/bin/bash
# ab11.sh OUT N: fleetgraph-only compare at 1M, control vs final alternating, N each.
set -u
out=$1; n=$2; mkdir -p $out
(cd /work/wt/final/cmd/fleetbench && go build -o /tmp/fb-final .) || exit 1
(cd /work/wt/control11/cmd/fleetbench && go build -o /tmp/fb-control .) || exit 1
for i in $(seq 1 $n); do
  for b in control final; do
    { uptime; echo "build=$b run=$i"; cd /tmp && /tmp/fb-$b compare -sizes 1000000 -stores fleetgraph -v; } > $out/ab-$b-$i.log 2>&1
  done
done
uptime > $out/DONE
