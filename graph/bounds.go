package graph

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// This file bounds what one request may ask the index for, beyond the
// document limits of limits.go: the size of each filter (checked before
// the index parses anything), and how many expensive reads run at once,
// per viewer and in total, so that no viewer can stall the others.

// filterOf validates a filter against the input limits and converts it.
// Errors are BAD_USER_INPUT and name the limit.
func (s *service) filterOf(f *model.ObjectFilter) (index.Filter, error) {
	if f == nil {
		return index.Filter{}, nil
	}
	l := s.limits
	for _, list := range []struct {
		name string
		n    int
	}{{"clusters", len(f.Clusters)}, {"namespaces", len(f.Namespaces)}, {"kinds", len(f.Kinds)}, {"statuses", len(f.Statuses)}} {
		if list.n > l.MaxFilterValues {
			return index.Filter{}, inputLimit("filter."+list.name, list.n, l.MaxFilterValues,
				"filter.%s has %d values; at most %d are allowed", list.name, list.n, l.MaxFilterValues)
		}
	}
	if f.NameContains != nil && len(*f.NameContains) > l.MaxNameContains {
		return index.Filter{}, inputLimit("filter.nameContains", len(*f.NameContains), l.MaxNameContains,
			"filter.nameContains is %d bytes; at most %d are allowed (no Kubernetes name is longer)", len(*f.NameContains), l.MaxNameContains)
	}
	for _, sel := range []struct {
		name string
		s    *string
	}{{"labelSelector", f.LabelSelector}, {"clusterLabelSelector", f.ClusterLabelSelector}} {
		if sel.s != nil {
			if err := l.checkSelector("filter."+sel.name, *sel.s); err != nil {
				return index.Filter{}, err
			}
		}
	}
	return toFilter(f), nil
}

// checkSelector bounds a label selector: its bytes first, before anything
// parses it, then its terms (each requirement, and each value of an in or
// notin list beyond the first).
func (l Limits) checkSelector(name, sel string) error {
	if len(sel) > l.MaxSelectorBytes {
		return inputLimit(name+".bytes", len(sel), l.MaxSelectorBytes,
			"%s is %d bytes; at most %d are allowed", name, len(sel), l.MaxSelectorBytes)
	}
	parsed, err := labels.Parse(sel)
	if err != nil {
		return newError(CodeBadUserInput, err, "%s", name)
	}
	reqs, _ := parsed.Requirements()
	terms := 0
	for _, r := range reqs {
		terms++
		if op := r.Operator(); op == selection.In || op == selection.NotIn {
			terms += max(r.Values().Len()-1, 0)
		}
	}
	if terms > l.MaxSelectorTerms {
		return inputLimit(name+".terms", terms, l.MaxSelectorTerms,
			"%s has %d terms (requirements and listed values); at most %d are allowed", name, terms, l.MaxSelectorTerms)
	}
	return nil
}

// inputLimit is a BAD_USER_INPUT error that names the limit hit, as the
// document limits do.
func inputLimit(limit string, got, max int, format string, a ...any) error {
	return newError(CodeBadUserInput, nil, format, a...).with("limit", limit).with("value", got).with("max", max)
}

// isScan reports whether an objects or facets read over filter in order
// must visit every candidate row rather than read counts or walk an index:
// a label selector or a name search (checked row by row), or an order the
// index does not keep (every match is sorted). These are what ScanCost
// prices and what the scan slots admit.
func isScan(f *model.ObjectFilter, o *model.ObjectOrder) bool {
	if f != nil && (f.LabelSelector != nil && *f.LabelSelector != "" || f.NameContains != nil && *f.NameContains != "") {
		return true
	}
	return o != nil && o.Field != model.ObjectOrderFieldName
}

// admission bounds the expensive reads in flight: scans per viewer and in
// total, and live object(...) reads per viewer. A read over a bound waits
// for a slot until its request's deadline or until its client goes away;
// the viewer's own excess work waits behind itself, and the total bound
// keeps a core free for everyone else's cheap reads.
type admission struct {
	limits Limits
	total  chan struct{} // one token per running scan
	gauge  *prometheus.GaugeVec
	done   *prometheus.CounterVec // admitted reads that ended

	mu    sync.Mutex
	freed map[string]chan struct{} // viewer key -> closed when one of its slots frees
	scans map[string]int           // viewer key -> scans admitted
	live  map[string]int           // viewer key -> live reads admitted
}

// The kinds of expensive reads, as the expensive_reads gauge labels them.
const (
	readScan = "scan"
	readLive = "live"
)

func newAdmission(l Limits, gauge *prometheus.GaugeVec, done *prometheus.CounterVec) *admission {
	return &admission{
		limits: l, total: make(chan struct{}, l.MaxConcurrentScans), gauge: gauge, done: done,
		freed: map[string]chan struct{}{}, scans: map[string]int{}, live: map[string]int{},
	}
}

// scan admits one scan for v, waiting for a slot of v's and then one of the
// server's; release frees both.
func (a *admission) scan(ctx context.Context, v *viewer) (release func(), err error) {
	key := v.id.Key()
	waiting := a.gauge.WithLabelValues(readScan, "waiting")
	waiting.Inc()
	defer waiting.Dec()
	if err := a.acquire(ctx, a.scans, key, a.limits.MaxScansPerViewer, "scans"); err != nil {
		return nil, err
	}
	select {
	case a.total <- struct{}{}:
	case <-ctx.Done():
		a.release(a.scans, key)
		return nil, waitError(ctx, "a scan slot of the server (it runs %d at once)", a.limits.MaxConcurrentScans)
	}
	running := a.gauge.WithLabelValues(readScan, "running")
	running.Inc()
	return func() { running.Dec(); a.done.WithLabelValues(readScan).Inc(); <-a.total; a.release(a.scans, key) }, nil
}

// liveRead admits one object(...) read for v.
func (a *admission) liveRead(ctx context.Context, v *viewer) (release func(), err error) {
	key := v.id.Key()
	waiting := a.gauge.WithLabelValues(readLive, "waiting")
	waiting.Inc()
	defer waiting.Dec()
	if err := a.acquire(ctx, a.live, key, a.limits.MaxLiveReadsPerViewer, "live reads"); err != nil {
		return nil, err
	}
	running := a.gauge.WithLabelValues(readLive, "running")
	running.Inc()
	return func() { running.Dec(); a.done.WithLabelValues(readLive).Inc(); a.release(a.live, key) }, nil
}

// acquire takes one of max slots of key in counts, waiting until one is
// free or ctx ends.
func (a *admission) acquire(ctx context.Context, counts map[string]int, key string, max int, what string) error {
	for {
		a.mu.Lock()
		if counts[key] < max {
			counts[key]++
			a.mu.Unlock()
			return nil
		}
		ch, ok := a.freed[key]
		if !ok {
			ch = make(chan struct{})
			a.freed[key] = ch
		}
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return waitError(ctx, "one of your %d %s in flight to finish", max, what)
		}
	}
}

// release frees a slot of key and wakes its waiters, which try again.
func (a *admission) release(counts map[string]int, key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if counts[key]--; counts[key] <= 0 {
		delete(counts, key)
	}
	if ch, ok := a.freed[key]; ok {
		close(ch)
		delete(a.freed, key)
	}
}

// waitError says what a request was waiting for when its context ended.
func waitError(ctx context.Context, format string, a ...any) error {
	what := fmt.Sprintf(format, a...)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return newError(CodeDeadlineExceeded, nil, "the request's deadline passed while waiting for %s", what)
	}
	return newError(CodeCanceled, nil, "the request was canceled while waiting for %s", what)
}
