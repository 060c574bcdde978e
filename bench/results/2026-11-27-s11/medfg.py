#!/usr/bin/env python3
# medfg.py DIR: medians of the fleetgraph A/B (ab-control-N.log, ab-final-N.log) and a permutation test.
import sys, re, glob, itertools, statistics
d = sys.argv[1]
def parse(f):
    r = {}
    for line in open(f):
        m = re.match(r'compare: size=(\d+) workload=(\S+) (.*)', line)
        if m:
            kv = dict(x.split('=', 1) for x in m.group(3).split())
            for k in ('fleetgraph_p50_us', 'fleetgraph_p99_us'):
                if k in kv:
                    r[(m.group(2), k.split('_')[1])] = float(kv[k])
        m = re.match(r'compare: size=(\d+) load_s (.*)', line)
        if m:
            toks = m.group(2).split()
            i = toks.index('bytes_per_object')
            for t in toks[i+1:]:
                if t.startswith('fleetgraph='):
                    r[('mem', 'B/obj')] = float(t.split('=')[1])
    return r
A = [parse(f) for f in sorted(glob.glob(d + '/ab-control-*.log'))]
B = [parse(f) for f in sorted(glob.glob(d + '/ab-final-*.log'))]
keys = sorted(set().union(*A, *B))
def perm(a, b):
    obs = abs(statistics.median(b) - statistics.median(a)); allv = a + b; n = len(a); c = t = 0
    for idx in itertools.combinations(range(len(allv)), n):
        x = [allv[i] for i in idx]; y = [allv[i] for i in range(len(allv)) if i not in idx]
        t += 1; c += abs(statistics.median(y) - statistics.median(x)) >= obs - 1e-9
    return c / t
print(f'{len(A)} control, {len(B)} final runs')
for k in keys:
    a = [r[k] for r in A if k in r]; b = [r[k] for r in B if k in r]
    if not a or not b: continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f'{k[0]:6} {k[1]:6} control {ma:8.1f} final {mb:8.1f} {100*(mb-ma)/ma:+6.1f}% p={perm(a,b):.3f}  c={a} f={b}')
