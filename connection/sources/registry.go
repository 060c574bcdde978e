package sources

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/connection"
)

// Fleet is what a Registry drives; connection.Manager implements it.
type Fleet interface {
	Add(spec connection.Spec) error
	Remove(ctx context.Context, name string) error
	Reconnect(name string) error
	SetLabels(ctx context.Context, name string, labels map[string]string) error
}

// Claim says that one source object names a cluster, and how to reach it.
type Claim struct {
	// Source is the source's name ("capi"); Object names the source object
	// within it ("default/prod-east"). Together they identify the claim.
	Source, Object string
	// Cluster is the cluster's name in fleetgraph.
	Cluster string
	// Labels are the cluster's labels, from the source object.
	Labels map[string]string
	// Config builds the cluster's client config from the source's current
	// state. It is called on every connect; its error is shown on the
	// cluster.
	Config func(ctx context.Context) (*rest.Config, error)
	// Version identifies the credentials Config would use now (a Secret's
	// resourceVersion, a hash of an inline config). A claim whose Version
	// changes reconnects its cluster, so rotated credentials are used
	// without a restart.
	Version string
}

func (c *Claim) ref() string { return c.Source + " " + c.Object }

// ErrConflict is returned (wrapped) as the connection error of a cluster
// that two source objects name.
var ErrConflict = errors.New("two sources name this cluster")

// Registry turns the claims of every source into the Fleet's clusters.
//
// Concurrency: Set and Delete may be called from any goroutine; they are
// serialized by apply, so the Fleet sees Add, Reconnect and Remove in the
// order the claims changed. mu guards the claims and is never held while
// calling the Fleet: Remove waits for the cluster's goroutine, which may be
// inside Config, which takes mu.
type Registry struct {
	fleet Fleet
	log   *slog.Logger

	apply sync.Mutex // held across one Set or Delete, Fleet calls included

	mu        sync.Mutex
	byObject  map[string]*Claim   // ref -> claim
	byCluster map[string][]*Claim // cluster -> claims, oldest first
	listed    map[string]error    // source -> nil once listed, else why not yet
}

// NewRegistry returns a Registry that adds, reconnects and removes clusters
// of fleet. logger nil means slog.Default().
func NewRegistry(fleet Fleet, logger *slog.Logger) *Registry {
	if logger == nil {
		logger = slog.Default()
	}
	return &Registry{
		fleet: fleet, log: logger,
		byObject: map[string]*Claim{}, byCluster: map[string][]*Claim{}, listed: map[string]error{},
	}
}

// Set adds or updates a claim. A new cluster name adds the cluster; a
// second claim of a name already claimed is a conflict, reported as the
// cluster's connection error until one of the two goes; changed labels
// relabel the cluster in place; a changed Version reconnects it.
func (r *Registry) Set(c Claim) {
	r.apply.Lock()
	defer r.apply.Unlock()
	if err := validClusterName(c.Cluster); err != nil {
		r.log.Error("source object names an invalid cluster", "source", c.Source, "object", c.Object, "err", err)
		return
	}
	nc := c
	nc.Labels = maps.Clone(c.Labels)

	r.mu.Lock()
	old := r.byObject[nc.ref()]
	if old != nil && old.Cluster != nc.Cluster {
		r.mu.Unlock()
		r.deleteLocked(context.Background(), old)
		r.mu.Lock()
		old = nil
	}
	claims := r.byCluster[nc.Cluster]
	r.byObject[nc.ref()] = &nc
	if old != nil {
		claims[slices.Index(claims, old)] = &nc
	} else {
		claims = append(claims, &nc)
	}
	r.byCluster[nc.Cluster] = claims
	first := len(claims) == 1
	r.mu.Unlock()

	log := r.log.With("cluster", nc.Cluster, "source", nc.Source, "object", nc.Object)
	switch {
	case old == nil && first:
		err := r.fleet.Add(connection.Spec{
			Name: nc.Cluster, Labels: nc.Labels,
			Config: func(ctx context.Context) (*rest.Config, error) { return r.config(ctx, nc.Cluster) },
		})
		if err != nil {
			log.Error("adding cluster failed", "err", err)
			return
		}
		log.Info("cluster added")
	case old == nil:
		log.Error("cluster is named by another source object too; it stays disconnected until one of them goes",
			"others", refs(claims[:len(claims)-1]))
		r.reconnect(log, nc.Cluster)
	case first:
		if !maps.Equal(old.Labels, nc.Labels) {
			r.setLabels(log, nc.Cluster, nc.Labels)
		}
		if old.Version != nc.Version {
			log.Info("cluster credentials changed; reconnecting")
			r.reconnect(log, nc.Cluster)
		}
	}
}

// Delete removes a source object's claim. The cluster goes, with its rows,
// when no claim is left; when one is left after a conflict, the cluster
// reconnects with it.
func (r *Registry) Delete(ctx context.Context, source, object string) {
	r.apply.Lock()
	defer r.apply.Unlock()
	r.mu.Lock()
	c := r.byObject[source+" "+object]
	r.mu.Unlock()
	if c != nil {
		r.deleteLocked(ctx, c)
	}
}

// deleteLocked removes c; apply must be held and mu not.
func (r *Registry) deleteLocked(ctx context.Context, c *Claim) {
	r.mu.Lock()
	delete(r.byObject, c.ref())
	claims := slices.DeleteFunc(r.byCluster[c.Cluster], func(o *Claim) bool { return o == c })
	if len(claims) == 0 {
		delete(r.byCluster, c.Cluster)
	} else {
		r.byCluster[c.Cluster] = claims
	}
	r.mu.Unlock()

	log := r.log.With("cluster", c.Cluster, "source", c.Source, "object", c.Object)
	switch len(claims) {
	case 0:
		if err := r.fleet.Remove(ctx, c.Cluster); err != nil {
			log.Error("removing cluster failed", "err", err)
			return
		}
		log.Info("cluster removed with its source object")
	case 1:
		log.Info("conflict resolved; reconnecting with the remaining source object", "remaining", claims[0].ref())
		r.setLabels(log, c.Cluster, claims[0].Labels)
		r.reconnect(log, c.Cluster)
	}
}

func (r *Registry) setLabels(log *slog.Logger, cluster string, labels map[string]string) {
	if err := r.fleet.SetLabels(context.Background(), cluster, maps.Clone(labels)); err != nil {
		log.Error("relabelling cluster failed", "err", err)
	}
}

func (r *Registry) reconnect(log *slog.Logger, cluster string) {
	if err := r.fleet.Reconnect(cluster); err != nil {
		log.Error("reconnect failed", "err", err)
	}
}

// config builds the client config of a cluster from its one claim.
func (r *Registry) config(ctx context.Context, cluster string) (*rest.Config, error) {
	r.mu.Lock()
	claims := slices.Clone(r.byCluster[cluster])
	r.mu.Unlock()
	switch len(claims) {
	case 0:
		return nil, fmt.Errorf("no source names cluster %q any more", cluster)
	case 1:
		c := claims[0]
		cfg, err := c.Config(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.ref(), err)
		}
		return cfg, nil
	default:
		return nil, fmt.Errorf("%w: %s; rename one (label or annotation %s) or remove it",
			ErrConflict, strings.Join(refs(claims), " and "), ClusterNameKey)
	}
}

func refs(claims []*Claim) []string {
	out := make([]string, len(claims))
	for i, c := range claims {
		out[i] = c.ref()
	}
	return out
}

// Claims returns the claims of the given source, by object.
func (r *Registry) Claims(source string) map[string]Claim {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]Claim{}
	for _, c := range r.byObject {
		if c.Source == source {
			out[c.Object] = *c
		}
	}
	return out
}

// Expect records that a source is configured, so that Ready waits for its
// first listing.
func (r *Registry) Expect(source string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.listed[source]; !ok {
		r.listed[source] = errNotListed
	}
}

var errNotListed = errors.New("not listed yet")

// Listed records that a source has listed its objects once and set their
// claims, or why it cannot yet (err).
func (r *Registry) Listed(source string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.listed[source]; ok && prev == nil {
		return // listed once is listed
	}
	if err == nil {
		r.listed[source] = nil
		return
	}
	r.listed[source] = err
}

// Ready returns nil once every expected source has listed once, else an
// error naming the ones that have not and why.
func (r *Registry) Ready() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, s := range slices.Sorted(maps.Keys(r.listed)) {
		if err := r.listed[s]; err != nil {
			errs = append(errs, fmt.Errorf("source %s: %w", s, err))
		}
	}
	return errors.Join(errs...)
}

// validClusterName rejects names no cluster can have: empty, longer than
// a Kubernetes object name, or holding control characters (which would
// corrupt logs and index keys).
func validClusterName(name string) error {
	switch {
	case name == "":
		return errors.New("empty cluster name")
	case len(name) > maxClusterName:
		return fmt.Errorf("cluster name %.40q... is longer than %d bytes", name, maxClusterName)
	case !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("cluster name %q holds control characters or invalid UTF-8", name)
	}
	return nil
}

// maxClusterName is the longest Kubernetes object name: every source names
// clusters after objects or fields of that size.
const maxClusterName = 253
